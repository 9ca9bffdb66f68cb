// llamacpp-greedy: greedy generation with llama.cpp for a file of prompts, printing the token ids
// and each step's two best logits as JSON lines, so that tools/llamacpp_diff.py can compare
// `rustorch-cli greedy` (which prints the same format) with llama.cpp token by token.
//
// usage: llamacpp-greedy -m MODEL -f PROMPTS.jsonl [-n 48] [-c 4096] [-t 2]
//
// PROMPTS.jsonl: one JSON object per line, {"id": "...", "text": "..."}; the text is final (a chat
// template already applied); BOS is added by the tokenizer as the model's metadata says.
// Output, one line per prompt:
//   {"id":"<id>","prompt_tokens":[...],"tokens":[...],"top":[[id1,logit1,id2,logit2],...]}
//
// Protocol (the one `rustorch-cli greedy` follows): llama_context_default_params() (flash
// attention auto, F16 KV cache, swa_full, n_ubatch 512) with n_ctx = -c and n_batch = n_ctx, so
// that the whole prompt goes to one llama_decode and llama.cpp itself splits it into 512-position
// micro-batches, as its own tools do; n_threads = n_threads_batch = -t; default model params
// (mmap), CPU only. Per prompt: the memory is cleared, the text tokenized with add_special and
// parse_special, the prompt decoded with logits for its last position only, then each step takes
// the argmax of the last logits (the lowest id among equal maxima), records the two best ids and
// logits, stops after an end-of-generation token (which is kept) or after -n tokens, and
// otherwise decodes the chosen token alone.
//
// llama.cpp's log goes to stderr, warnings and errors only (RUSTORCH_GREEDY_VERBOSE=1: all).
// Errors (bad arguments, a prompt that does not fit the context, a failed decode) go to stderr
// with exit status 1.
#include "llama.h"

#include <cctype>
#include <cerrno>
#include <clocale>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

bool g_verbose = false;

void log_callback(ggml_log_level level, const char * text, void *) {
    // Continuation lines belong to the message before them; keep them only with everything.
    if (g_verbose || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

[[noreturn]] void fail(const std::string & msg) {
    fprintf(stderr, "llamacpp-greedy: %s\n", msg.c_str());
    exit(1);
}

// A minimal JSON reader for the prompt lines: an object whose "id" and "text" members are
// strings; other members of any type are skipped. Strings are decoded to UTF-8 (\u escapes with
// surrogate pairs included) because the text goes to the tokenizer byte for byte.
struct JsonReader {
    const std::string & s;
    size_t i = 0;

    explicit JsonReader(const std::string & src) : s(src) {}

    [[noreturn]] void error(const char * what) const {
        throw std::runtime_error(std::string(what) + " at byte " + std::to_string(i));
    }
    void ws() {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) {
            i++;
        }
    }
    char peek() {
        ws();
        if (i >= s.size()) {
            error("unexpected end of line");
        }
        return s[i];
    }
    void expect(char c) {
        if (peek() != c) {
            error((std::string("expected '") + c + "'").c_str());
        }
        i++;
    }
    static void put_utf8(std::string & out, uint32_t cp) {
        if (cp < 0x80) {
            out += (char) cp;
        } else if (cp < 0x800) {
            out += (char) (0xC0 | (cp >> 6));
            out += (char) (0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += (char) (0xE0 | (cp >> 12));
            out += (char) (0x80 | ((cp >> 6) & 0x3F));
            out += (char) (0x80 | (cp & 0x3F));
        } else {
            out += (char) (0xF0 | (cp >> 18));
            out += (char) (0x80 | ((cp >> 12) & 0x3F));
            out += (char) (0x80 | ((cp >> 6) & 0x3F));
            out += (char) (0x80 | (cp & 0x3F));
        }
    }
    uint32_t hex4() {
        if (i + 4 > s.size()) {
            error("short \\u escape");
        }
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            const char c = s[i++];
            v <<= 4;
            if (c >= '0' && c <= '9') {
                v |= c - '0';
            } else if (c >= 'a' && c <= 'f') {
                v |= c - 'a' + 10;
            } else if (c >= 'A' && c <= 'F') {
                v |= c - 'A' + 10;
            } else {
                error("bad \\u escape");
            }
        }
        return v;
    }
    std::string string() {
        expect('"');
        std::string out;
        while (true) {
            if (i >= s.size()) {
                error("unterminated string");
            }
            const char c = s[i++];
            if (c == '"') {
                return out;
            }
            if ((unsigned char) c < 0x20) {
                error("control character in string");
            }
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i >= s.size()) {
                error("unterminated escape");
            }
            const char e = s[i++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    uint32_t cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00) {
                        // A high surrogate must be followed by an escaped low one.
                        if (i + 2 > s.size() || s[i] != '\\' || s[i + 1] != 'u') {
                            error("lone high surrogate");
                        }
                        i += 2;
                        const uint32_t lo = hex4();
                        if (lo < 0xDC00 || lo >= 0xE000) {
                            error("bad low surrogate");
                        }
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp < 0xE000) {
                        error("lone low surrogate");
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: error("bad escape");
            }
        }
    }
    void skip_value() {
        const char c = peek();
        if (c == '"') {
            string();
        } else if (c == '{' || c == '[') {
            const char close = c == '{' ? '}' : ']';
            i++;
            if (peek() == close) {
                i++;
                return;
            }
            while (true) {
                if (close == '}') {
                    string();
                    expect(':');
                }
                skip_value();
                if (peek() == ',') {
                    i++;
                    continue;
                }
                expect(close);
                return;
            }
        } else {
            // Numbers and the literals true, false, null.
            const size_t start = i;
            while (i < s.size() && (isalnum((unsigned char) s[i]) || s[i] == '-' || s[i] == '+' || s[i] == '.')) {
                i++;
            }
            if (i == start) {
                error("unexpected character");
            }
        }
    }
    // Reads {"id": ..., "text": ...}; fails unless both are strings.
    void prompt(std::string & id, std::string & text) {
        bool have_id = false, have_text = false;
        expect('{');
        if (peek() != '}') {
            while (true) {
                const std::string key = string();
                expect(':');
                if (key == "id" || key == "text") {
                    if (peek() != '"') {
                        error(("\"" + key + "\" is not a string").c_str());
                    }
                    (key == "id" ? id : text) = string();
                    (key == "id" ? have_id : have_text) = true;
                } else {
                    skip_value();
                }
                if (peek() == ',') {
                    i++;
                    continue;
                }
                break;
            }
        }
        expect('}');
        ws();
        if (i != s.size()) {
            error("trailing characters");
        }
        if (!have_id || !have_text) {
            error("the object needs string members \"id\" and \"text\"");
        }
    }
};

std::string json_string(const std::string & v) {
    std::string out = "\"";
    for (const char c : v) {
        const unsigned char u = (unsigned char) c;
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20 || u == 0x7F) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\u%04x", u);
            out += buf;
        } else {
            out += c; // UTF-8 bytes pass through: JSON text is UTF-8
        }
    }
    return out + "\"";
}

std::string json_float(float v) {
    // %.9g round-trips every f32; JSON has no infinities or NaN.
    if (!std::isfinite(v)) {
        return "null";
    }
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double) v);
    return buf;
}

int parse_int(const char * flag, const char * v, int min) {
    char * end = nullptr;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < min || x > std::numeric_limits<int>::max()) {
        fail(std::string(flag) + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
    }
    return (int) x;
}

void usage(FILE * to) {
    fputs("usage: llamacpp-greedy -m MODEL -f PROMPTS.jsonl [-n 48] [-c 4096] [-t 2]\n", to);
}

} // namespace

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C"); // %.9g must print a decimal point whatever the locale
    std::string model_path, prompts_path;
    int n_gen = 48, n_ctx = 4096, n_threads = 2;
    for (int a = 1; a < argc; a++) {
        const std::string arg = argv[a];
        if (arg == "-h" || arg == "--help") {
            usage(stdout);
            return 0;
        }
        if (a + 1 >= argc) {
            usage(stderr);
            fail("missing value for " + arg);
        }
        const char * v = argv[++a];
        if (arg == "-m") {
            model_path = v;
        } else if (arg == "-f") {
            prompts_path = v;
        } else if (arg == "-n") {
            n_gen = parse_int("-n", v, 1);
        } else if (arg == "-c") {
            n_ctx = parse_int("-c", v, 1);
        } else if (arg == "-t") {
            n_threads = parse_int("-t", v, 1);
        } else {
            usage(stderr);
            fail("unknown argument " + arg);
        }
    }
    if (model_path.empty() || prompts_path.empty()) {
        usage(stderr);
        fail("-m and -f are required");
    }

    // Read every prompt before loading the model: a malformed file fails fast.
    std::vector<std::pair<std::string, std::string>> prompts;
    {
        std::ifstream in(prompts_path, std::ios::binary);
        if (!in) {
            fail("cannot open " + prompts_path);
        }
        std::string line;
        int line_no = 0;
        while (std::getline(in, line)) {
            line_no++;
            if (!line.empty() && line.back() == '\r') {
                line.pop_back();
            }
            if (line.find_first_not_of(" \t") == std::string::npos) {
                continue;
            }
            std::string id, text;
            try {
                JsonReader(line).prompt(id, text);
            } catch (const std::exception & e) {
                fail(prompts_path + ":" + std::to_string(line_no) + ": " + e.what());
            }
            prompts.emplace_back(id, text);
        }
    }

    const char * verbose = getenv("RUSTORCH_GREEDY_VERBOSE");
    g_verbose = verbose != nullptr && strcmp(verbose, "0") != 0;
    llama_log_set(log_callback, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (model == nullptr) {
        fail("cannot load the model " + model_path);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) n_ctx;
    cparams.n_batch = (uint32_t) n_ctx;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fail("cannot create the llama.cpp context");
    }

    for (const auto & [id, text] : prompts) {
        llama_memory_clear(llama_get_memory(ctx), true);

        // A token never takes less than a byte, plus BOS/EOS: text.size() + 8 ids always suffice,
        // but ask again with the exact count should a tokenizer ever say otherwise.
        std::vector<llama_token> ptoks(text.size() + 8);
        int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), ptoks.data(), (int32_t) ptoks.size(), true, true);
        if (n < 0 && n != std::numeric_limits<int32_t>::min()) {
            ptoks.resize((size_t) -n);
            n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), ptoks.data(), (int32_t) ptoks.size(), true, true);
        }
        if (n <= 0) {
            fail("prompt " + id + ": tokenization gave no tokens (" + std::to_string(n) + ")");
        }
        ptoks.resize((size_t) n);
        // The prompt and every token it may generate must fit the context that -c set (llama.cpp
        // rounds its own up; the limit is the one asked for): rustorch-cli greedy's rule, so that
        // both refuse the same prompts.
        if ((int64_t) n + n_gen > n_ctx) {
            fail("prompt " + id + ": " + std::to_string(n) + " prompt tokens and " + std::to_string(n_gen) +
                 " generated ones do not fit the context of " + std::to_string(n_ctx) + " (-c)");
        }

        // llama_batch_get_one: positions continue the (cleared) memory, logits for the last
        // token only; llama_decode splits the prompt into n_ubatch micro-batches.
        std::vector<llama_token> batch_toks = ptoks;
        if (llama_decode(ctx, llama_batch_get_one(batch_toks.data(), (int32_t) batch_toks.size())) != 0) {
            fail("prompt " + id + ": llama_decode failed on the prompt");
        }

        std::vector<llama_token> out;
        std::string top;
        while (true) {
            const float * logits = llama_get_logits_ith(ctx, -1);
            if (logits == nullptr) {
                fail("prompt " + id + ": no logits");
            }
            // Strictly greater replaces: the lowest id wins among equal maxima, and an equal
            // later value becomes the second best (a zero margin). NaN never compares greater.
            int32_t i1 = -1, i2 = -1;
            float v1 = -std::numeric_limits<float>::infinity(), v2 = v1;
            for (int32_t j = 0; j < n_vocab; j++) {
                const float x = logits[j];
                if (x > v1 || (i1 < 0 && x == v1)) {
                    i2 = i1;
                    v2 = v1;
                    i1 = j;
                    v1 = x;
                } else if (x > v2 || (i2 < 0 && x == v2)) {
                    i2 = j;
                    v2 = x;
                }
            }
            if (i1 < 0) {
                fail("prompt " + id + ": every logit is NaN");
            }
            out.push_back(i1);
            top += std::string(top.empty() ? "" : ",") + "[" + std::to_string(i1) + "," + json_float(v1) + "," +
                   std::to_string(i2) + "," + json_float(v2) + "]";
            if (llama_vocab_is_eog(vocab, i1) || (int) out.size() >= n_gen) {
                break;
            }
            llama_token tok = i1;
            if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
                fail("prompt " + id + ": llama_decode failed at generated token " + std::to_string(out.size()));
            }
        }

        std::string line = "{\"id\":" + json_string(id) + ",\"prompt_tokens\":[";
        for (size_t k = 0; k < ptoks.size(); k++) {
            line += (k ? "," : "") + std::to_string(ptoks[k]);
        }
        line += "],\"tokens\":[";
        for (size_t k = 0; k < out.size(); k++) {
            line += (k ? "," : "") + std::to_string(out[k]);
        }
        line += "],\"top\":[" + top + "]}\n";
        fputs(line.c_str(), stdout);
        fflush(stdout);
    }

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    if (ferror(stdout)) {
        fail("cannot write the output");
    }
    return 0;
}
