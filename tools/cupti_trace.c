// A CUDA injection library (CUDA_INJECTION64_PATH) that records every
// kernel's start and end as the GPU ran it, graph nodes included, through
// CUPTI's activity API, into CUPTI_TRACE_OUT (CSV: start_ns,end_ns,name).
// For hosts without Nsight Systems: bench/device_cuda_profile.sh timeline
// builds it there (tools/build_cupti_trace.sh here) and reads the CSV.
// Kernels are not serialized (the concurrent-kernel activity kind), so
// the times are those of a normal run, overlapped launches included.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE* out;
#define BUF_BYTES (8u << 20)

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = (uint8_t*)aligned_alloc(8, BUF_BYTES);
    *size = BUF_BYTES;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity* rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && out) {
            const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)rec;
            fprintf(out, "%llu,%llu,%s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->name);
        }
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

int InitializeInjection(void) {
    const char* path = getenv("CUPTI_TRACE_OUT");
    out = fopen(path ? path : "cupti_trace.csv", "w");
    if (!out) return 0;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
    atexit(flush_at_exit);
    return 1;
}
