// One-op ggml_mul_mat on llama.cpp's CPU backend, with the weights in the
// buffer type llama.cpp's model loader would pick for them (the CPU_REPACK
// extra buffer where it supports the op, as in llama-model-loader.cpp's
// weight_buft_supported with a 512-row activation), and 2 threads.
//
// usage: mul_mat_ref TYPE ROWS COLS W_F32 X_F32 M_LIST OUT
//   W_F32: ROWS x COLS f32 (raw little-endian), quantized here with
//          ggml_quantize_chunk; X_F32: MMAX x COLS f32.
//   M_LIST: comma-separated activation row counts; each uses the first m
//           rows of X.
// OUT gets: u32 repacked flag, the quantized weight bytes, then for each m
// the m x ROWS f32 result; then the first 4 activation rows encoded by
// type_traits_cpu[vec_dot_type].from_float, one call per row.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

static void *read_all(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    void *p = malloc(want);
    if (fread(p, 1, want, f) != want) { fprintf(stderr, "short read %s\n", path); exit(1); }
    fclose(f);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 8) { fprintf(stderr, "usage: see source\n"); return 2; }
    enum ggml_type type = (enum ggml_type) atoi(argv[1]);
    int64_t rows = atoll(argv[2]), cols = atoll(argv[3]);
    float *wf = read_all(argv[4], sizeof(float) * rows * cols);
    FILE *fx = fopen(argv[5], "rb");
    fseek(fx, 0, SEEK_END);
    int64_t mmax = ftell(fx) / (sizeof(float) * cols);
    fclose(fx);
    float *xf = read_all(argv[5], sizeof(float) * mmax * cols);
    FILE *out = fopen(argv[7], "wb");

    ggml_cpu_init();
    size_t wbytes = ggml_row_size(type, cols) * rows;
    void *wq = malloc(wbytes);
    if (type == GGML_TYPE_F32) {
        memcpy(wq, wf, wbytes);
    } else {
        ggml_quantize_chunk(type, wf, wq, 0, rows, cols, NULL);
    }

    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 2);
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    uint32_t repacked = 0;
    // As llama.cpp's select_weight_buft: the first extra buffer type whose
    // supports_op accepts a mul_mat with this weight and 512 activations.
    if (get_extra) {
        for (ggml_backend_buffer_type_t *e = get_extra(dev); e && *e; ++e) {
            struct ggml_init_params ip = { ggml_tensor_overhead() * 8, NULL, true };
            struct ggml_context *c = ggml_init(ip);
            struct ggml_tensor *w = ggml_new_tensor_2d(c, type, cols, rows);
            struct ggml_tensor *b = ggml_new_tensor_2d(c, GGML_TYPE_F32, cols, 512);
            struct ggml_tensor *op = ggml_mul_mat(c, w, b);
            w->buffer = ggml_backend_buft_alloc_buffer(*e, 0);
            bool ok = ggml_backend_dev_supports_op(dev, op);
            ggml_backend_buffer_free(w->buffer);
            w->buffer = NULL;
            ggml_free(c);
            if (ok) {
                buft = *e;
                repacked = 1;
                fprintf(stderr, "type %s: weights in %s\n", ggml_type_name(type), ggml_backend_buft_name(*e));
                break;
            }
        }
    }
    fwrite(&repacked, 4, 1, out);
    fwrite(wq, 1, wbytes, out);

    struct ggml_init_params wp = { ggml_tensor_overhead() * 4, NULL, true };
    struct ggml_context *cw = ggml_init(wp);
    struct ggml_tensor *w = ggml_new_tensor_2d(cw, type, cols, rows);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(cw, buft);
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_tensor_set(w, wq, 0, wbytes);

    char *ms = strdup(argv[6]);
    for (char *tok = strtok(ms, ","); tok; tok = strtok(NULL, ",")) {
        int64_t m = atoll(tok);
        struct ggml_init_params xp = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true };
        struct ggml_context *cx = ggml_init(xp);
        struct ggml_tensor *x = ggml_new_tensor_2d(cx, GGML_TYPE_F32, cols, m);
        struct ggml_tensor *y = ggml_mul_mat(cx, w, x);
        struct ggml_cgraph *g = ggml_new_graph(cx);
        ggml_build_forward_expand(g, y);
        ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors_from_buft(cx, ggml_backend_dev_buffer_type(dev));
        ggml_backend_tensor_set(x, xf, 0, sizeof(float) * m * cols);
        if (ggml_backend_graph_compute(be, g) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); return 1; }
        float *res = malloc(sizeof(float) * m * rows);
        ggml_backend_tensor_get(y, res, 0, sizeof(float) * m * rows);
        fwrite(res, sizeof(float), m * rows, out);
        free(res);
        ggml_backend_buffer_free(xbuf);
        ggml_free(cx);
    }

    const struct ggml_type_traits_cpu *tt = ggml_get_type_traits_cpu(type);
    enum ggml_type vdt = tt->vec_dot_type;
    size_t arow = ggml_row_size(vdt, cols);
    void *abuf = malloc(arow);
    for (int64_t i = 0; i < mmax && i < 4; ++i) {
        if (vdt == GGML_TYPE_F32) {
            memcpy(abuf, xf + i * cols, arow);
        } else {
            ggml_get_type_traits_cpu(vdt)->from_float(xf + i * cols, abuf, cols);
        }
        fwrite(abuf, 1, arow, out);
    }
    fclose(out);
    return 0;
}
