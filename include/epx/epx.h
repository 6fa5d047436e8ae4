/* epx.h — the C ABI of epx: teams, HT and LL buffers, for callers that cannot use the C++ API
 * (the Python package loads it through ctypes; other languages through their FFI).
 *
 * It is a thin layer over the C++ API (epx/team.hpp, epx/ht.hpp, epx/ll.hpp): every call does what the
 * C++ method of the same name does, with the same checks and guarantees (read those headers for the
 * contracts). What this layer adds:
 *   - Errors: every function that can fail returns an epx_status. On failure, epx_last_error() gives the
 *     message of the C++ epx::Error ("epx rank 3: ..."), and epx_last_error_rank() its rank; both are
 *     per thread and describe the last failed call on that thread (a call that succeeds leaves them).
 *     No C++ exception ever crosses this interface.
 *   - Structs that can grow: every struct passed by pointer at the top level starts with `struct_size`
 *     and has an EPX_*_INIT initializer. The library reads the first struct_size bytes of an input
 *     (fields past them keep their INIT defaults) and writes at most struct_size bytes of an output; a
 *     struct_size larger than the library knows is refused (the caller was built against a newer epx.h).
 *     Nested value structs (epx_tensor, epx_ll_range, ...) have no size field: they never change.
 *   - Objects: opaque pointers made by *_create / returned in results, freed by the matching
 *     *_destroy / *_release. Destroying a team or a buffer is collective, like the C++ destructor.
 *   - Arguments are marked [in], [out] or [in, optional]; pointers are device pointers unless a field
 *     says "host". A zeroed epx_tensor is an absent (optional) tensor.
 *
 * Version: EPX_ABI_VERSION changes when a struct or a function changes incompatibly; epx_abi_version()
 * returns the library's. */
#ifndef EPX_EPX_H
#define EPX_EPX_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "epx/export.hpp"

#ifdef __cplusplus
extern "C" {
#endif

#define EPX_ABI_VERSION 2

/* ---- errors and library information ---------------------------------------------------------------- */

typedef enum epx_status {
  EPX_SUCCESS = 0,
  EPX_ERROR_INVALID_ARGUMENT = 1, /* epx::ErrorKind::invalid_argument */
  EPX_ERROR_CUDA = 2,             /* a CUDA runtime call failed */
  EPX_ERROR_NCCL = 3,             /* an NCCL call failed (including a run-time/compile-time version mismatch) */
  EPX_ERROR_TIMEOUT = 4,          /* a device-side wait ran past the team's timeout */
  EPX_ERROR_SYSTEM = 5,           /* an operating-system call failed, or memory ran out */
  EPX_ERROR_INTERNAL = 6,         /* a broken invariant inside epx: a bug, please report it */
} epx_status;

EPX_API int epx_abi_version(void);
EPX_API const char* epx_version(void); /* "0.1.0" */
/* NCCL_VERSION_CODE of the NCCL headers epx was compiled with (22809 for 2.28.9). A team refuses to start
 * when the NCCL loaded at run time reports another version: the device API's layouts must agree. */
EPX_API int epx_nccl_version_compiled(void);
/* The CUDA architectures the kernels were compiled for, as CMake named them ("90a"). */
EPX_API const char* epx_cuda_architectures(void);
EPX_API const char* epx_status_string(epx_status status);
/* The message of the last failed call on this thread ("" if none). Valid until the next failed call. */
EPX_API const char* epx_last_error(void);
/* The rank named by that message, or -1 when none was known (before a team existed). */
EPX_API int epx_last_error_rank(void);
/* sizeof of a struct of this header as the library was built ("epx_tensor", "epx_ht_dispatch_args", ...),
 * or 0 for an unknown name: lets a binding check its own copies of the layouts. */
EPX_API size_t epx_struct_size(const char* name);

/* ---- values shared by every call -------------------------------------------------------------------- */

/* epx::ScalarType, same order */
typedef enum epx_dtype {
  EPX_BF16 = 0,
  EPX_FP8_E4M3 = 1,
  EPX_FLOAT32 = 2,
  EPX_INT32 = 3,
  EPX_INT64 = 4,
  EPX_BOOL = 5
} epx_dtype;

/* epx::TensorRef: a 2-D view with element strides; epx never owns the memory. */
typedef struct epx_tensor {
  void* data;
  int32_t dtype; /* epx_dtype */
  int64_t rows, cols;
  int64_t row_stride, col_stride; /* in elements; row-major is (cols, 1) */
} epx_tensor;
/* An absent tensor (every optional input, and the INIT value of every tensor field). */
#define EPX_TENSOR_NONE \
  { NULL, EPX_BF16, 0, 0, 0, 0 }

/* epx::Streams: where a call runs. async = 0: on `stream`. async = 1: on the buffer's communication
 * stream after `stream` (or `previous_event`), and the result's `finished` event is recorded there (the
 * caller destroys it with cudaEventDestroy). A null epx_streams pointer means {stream 0, not async}. */
typedef struct epx_streams {
  size_t struct_size;
  cudaStream_t stream;
  int32_t async;
  cudaEvent_t previous_event; /* [in, optional], stays the caller's */
} epx_streams;
#define EPX_STREAMS_INIT \
  { sizeof(epx_streams), NULL, 0, NULL }

/* ---- teams (epx/team.hpp) --------------------------------------------------------------------------- */

typedef struct epx_team epx_team;

typedef struct epx_unique_id {
  char bytes[128];
} epx_unique_id;

typedef struct epx_team_options {
  size_t struct_size;
  int64_t wait_timeout_ms; /* bound on every device-side wait */
} epx_team_options;
#define EPX_TEAM_OPTIONS_INIT \
  { sizeof(epx_team_options), 5000 }

/* Rank 0 only: a new bootstrap token, to be shared with every rank out of band. */
EPX_API epx_status epx_team_make_unique_id(epx_unique_id* out);
/* Collective: one rank of an NCCL team on the calling thread's current CUDA device. options may be NULL. */
EPX_API epx_status epx_team_create_nccl(const epx_unique_id* id, int rank, int nranks, const epx_team_options* options,
                                        epx_team** out);
/* Collective. Every buffer of the team must be destroyed first. NULL is accepted. */
EPX_API epx_status epx_team_destroy(epx_team* team);
EPX_API epx_status epx_team_rank(const epx_team* team, int* out);
EPX_API epx_status epx_team_size(const epx_team* team, int* out);
EPX_API epx_status epx_team_device(const epx_team* team, int* out);
/* EPX_ERROR_TIMEOUT if a kernel of the team recorded an expired wait (call after synchronising). */
EPX_API epx_status epx_team_check_device_errors(epx_team* team);
EPX_API epx_status epx_team_failed(const epx_team* team, int* out);

/* ---- high-throughput buffers (epx/ht.hpp) ----------------------------------------------------------- */

typedef struct epx_ht_buffer epx_ht_buffer;
/* The routing of one dispatch (std::shared_ptr<const HtHandle>): for combine and cached dispatches.
 * Each handle returned in a result is the caller's, freed with epx_ht_handle_release. */
typedef struct epx_ht_handle epx_ht_handle;

typedef struct epx_ht_options {
  size_t struct_size;
  int32_t max_tokens_per_rank, hidden, max_topk, num_experts, handle_blocks; /* HtBufferOptions */
  int32_t num_sms;                                                           /* HtConfig; 0: default_ht_config */
  int32_t combine_output; /* HtBufferOptions::combine_output: 1, or 0 (then every combine passes out) */
} epx_ht_options;
#define EPX_HT_OPTIONS_INIT \
  { sizeof(epx_ht_options), 4096, 7168, 8, 256, 4, 0, 1 }

/* Bytes per rank an HT buffer of these options needs on a team of num_ranks (no GPU needed). */
EPX_API epx_status epx_ht_required_bytes(const epx_ht_options* options, int num_ranks, size_t* out);
EPX_API epx_status epx_ht_default_num_sms(int num_ranks, int* out);
/* Collective. */
EPX_API epx_status epx_ht_buffer_create(epx_team* team, const epx_ht_options* options, epx_ht_buffer** out);
/* Collective. Handles still held stay valid to release. NULL is accepted. */
EPX_API epx_status epx_ht_buffer_destroy(epx_ht_buffer* buffer);
EPX_API epx_status epx_ht_buffer_bytes(const epx_ht_buffer* buffer, size_t* out);
EPX_API epx_status epx_ht_get_num_sms(const epx_ht_buffer* buffer, int* out);
EPX_API epx_status epx_ht_set_num_sms(epx_ht_buffer* buffer, int num_sms);
EPX_API epx_status epx_ht_handle_release(epx_ht_handle* handle); /* NULL is accepted */

typedef struct epx_ht_layout {    /* caller-allocated device outputs */
  int32_t* num_tokens_per_rank;   /* [R] */
  int32_t* num_tokens_per_expert; /* [E] */
  bool* is_token_in_rank;         /* [T][R] */
} epx_ht_layout;

/* Local (not collective). *finished (may be NULL when not async) gets the async event, else NULL. */
EPX_API epx_status epx_ht_get_layout(epx_ht_buffer* buffer, const epx_tensor* topk_idx, const epx_ht_layout* out,
                                     const epx_streams* streams, cudaEvent_t* finished);

typedef struct epx_ht_dispatch_args {
  size_t struct_size;
  epx_tensor x;                /* [T][H] bf16 or fp8_e4m3 */
  epx_tensor x_scales;         /* fp8 only: [T][H/128] float32, any strides */
  epx_tensor topk_idx;         /* [T][K] int64 or int32 */
  epx_tensor topk_weights;     /* [in, optional] [T][K] float32 */
  int32_t expert_alignment;    /* >= 1 */
  int64_t num_worst_tokens;    /* > 0: worst-case form */
  const epx_ht_handle* cached; /* [in, optional] cached form: an earlier dispatch's handle */
} epx_ht_dispatch_args;
#define EPX_HT_DISPATCH_ARGS_INIT \
  { sizeof(epx_ht_dispatch_args), EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, 1, 0, NULL }

typedef struct epx_ht_dispatch_result {
  size_t struct_size;
  int64_t num_rows;        /* [out] rows of every output */
  int64_t num_recv_tokens; /* [out] N, or -1 in worst-case form */
  epx_tensor recv_x, recv_x_scales, recv_src_idx, recv_topk_idx, recv_topk_weights; /* [out] views into the buffer */
  epx_tensor num_recv_tokens_per_expert;                                            /* [out] [E_local] int32, device */
  /* [in, optional] a host array of E_local ints that receives the per-expert counts in the exact and
   * cached forms; num_recv_tokens_per_expert_host_valid [out] says whether it was written. */
  int32_t* num_recv_tokens_per_expert_host;
  int32_t num_recv_tokens_per_expert_host_valid;
  epx_ht_handle* handle; /* [out] the caller's: release it */
  cudaEvent_t finished;  /* [out] with async */
  /* [out] [R][R] int32, device, held by the handle: [s][d] = tokens rank s sends rank d */
  epx_tensor count_matrix;
} epx_ht_dispatch_result;
#define EPX_HT_DISPATCH_RESULT_INIT                                                                           \
  {                                                                                                           \
    sizeof(epx_ht_dispatch_result), 0, 0, EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, \
        EPX_TENSOR_NONE, EPX_TENSOR_NONE, NULL, 0, NULL, NULL, EPX_TENSOR_NONE                                \
  }

/* Collective. Outputs are views into the buffer, valid until the next dispatch on it is enqueued. */
EPX_API epx_status epx_ht_dispatch(epx_ht_buffer* buffer, const epx_ht_dispatch_args* args, const epx_streams* streams,
                                   epx_ht_dispatch_result* result);

/* HtDispatchCopies: [in, optional] each (caller memory) gets the output of its name */
typedef struct epx_ht_dispatch_copies {
  size_t struct_size;
  epx_tensor recv_x, recv_x_scales, recv_src_idx, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert;
} epx_ht_dispatch_copies;
#define EPX_HT_DISPATCH_COPIES_INIT                                                                     \
  {                                                                                                     \
    sizeof(epx_ht_dispatch_copies), EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, \
        EPX_TENSOR_NONE, EPX_TENSOR_NONE                                                                \
  }

/* Local (not collective): the latest dispatch's outputs into caller memory, ordered as a call on the
 * buffer. *finished (may be NULL when not async) gets the async event, else NULL. */
EPX_API epx_status epx_ht_copy_dispatch_outputs(epx_ht_buffer* buffer, const epx_ht_dispatch_copies* to,
                                                const epx_streams* streams, cudaEvent_t* finished);

typedef struct epx_ht_combine_args {
  size_t struct_size;
  epx_tensor y;                /* [rows >= N][H] bf16 */
  epx_tensor topk_weights;     /* [in, optional] [rows][K] float32 */
  epx_tensor bias;             /* [in, optional] [T][H] bf16 */
  const epx_ht_handle* handle; /* the dispatch this combine reverses */
  epx_tensor out;              /* [in, optional] [T][H] bf16, row stride H: where the sums go (else the buffer's) */
  epx_tensor out_weights;      /* [in, optional] [T][K] float32, row stride K, with topk_weights */
  epx_tensor second_bias;      /* [in, optional] [T][H] bf16, added after bias */
} epx_ht_combine_args;
#define EPX_HT_COMBINE_ARGS_INIT                                                                           \
  {                                                                                                        \
    sizeof(epx_ht_combine_args), EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, NULL, EPX_TENSOR_NONE, \
        EPX_TENSOR_NONE, EPX_TENSOR_NONE                                                                   \
  }

typedef struct epx_ht_combine_result {
  size_t struct_size;
  epx_tensor x;            /* [out] [T][H] bf16: args.out, or in the buffer, valid until the next combine is enqueued */
  epx_tensor topk_weights; /* [out] [T][K] float32 when weights were given (args.out_weights, or the buffer's) */
  cudaEvent_t finished;    /* [out] with async */
} epx_ht_combine_result;
#define EPX_HT_COMBINE_RESULT_INIT \
  { sizeof(epx_ht_combine_result), EPX_TENSOR_NONE, EPX_TENSOR_NONE, NULL }

/* Collective. */
EPX_API epx_status epx_ht_combine(epx_ht_buffer* buffer, const epx_ht_combine_args* args, const epx_streams* streams,
                                  epx_ht_combine_result* result);
/* Where combine reads y (and its weights) from: writing them there saves combine a copy. */
EPX_API epx_status epx_ht_combine_input(const epx_ht_buffer* buffer, int64_t rows, int64_t hidden, epx_tensor* out);
EPX_API epx_status epx_ht_combine_input_weights(const epx_ht_buffer* buffer, int64_t rows, int64_t topk,
                                                epx_tensor* out);
/* Errors kernels recorded without a host wait (worst-case form, get_layout): call after synchronising. */
EPX_API epx_status epx_ht_check_errors(epx_ht_buffer* buffer);

/* ---- low-latency buffers (epx/ll.hpp) --------------------------------------------------------------- */

typedef struct epx_ll_buffer epx_ll_buffer;
/* A receive step left by a send_only call: run it exactly once (epx_ll_receive_run), then release it. */
typedef struct epx_ll_receive epx_ll_receive;

typedef struct epx_ll_options {
  size_t struct_size;
  int32_t max_tokens_per_rank, hidden, max_topk, num_experts; /* LlBufferOptions */
  int32_t num_sms;                                            /* LlConfig; 0: the default for the GPU and team */
  int32_t mask_on_timeout; /* LlBufferOptions::mask_on_timeout (DeepEP's enable_shrink) */
} epx_ll_options;
#define EPX_LL_OPTIONS_INIT \
  { sizeof(epx_ll_options), 128, 7168, 8, 256, 0, 0 }

EPX_API epx_status epx_ll_required_bytes(const epx_ll_options* options, int num_ranks, size_t* out);
/* Collective. */
EPX_API epx_status epx_ll_buffer_create(epx_team* team, const epx_ll_options* options, epx_ll_buffer** out);
/* Collective. NULL is accepted. Receive steps not yet released must not be run afterwards. */
EPX_API epx_status epx_ll_buffer_destroy(epx_ll_buffer* buffer);
EPX_API epx_status epx_ll_buffer_bytes(const epx_ll_buffer* buffer, size_t* out);
EPX_API epx_status epx_ll_get_num_sms(const epx_ll_buffer* buffer, int* out);
EPX_API epx_status epx_ll_set_num_sms(epx_ll_buffer* buffer, int num_sms);

/* LlBuffer::OutputBytes */
typedef struct epx_ll_output_bytes {
  size_t struct_size;
  size_t x, scales, recv_count, src_idx, layout_range;
} epx_ll_output_bytes;
#define EPX_LL_OUTPUT_BYTES_INIT \
  { sizeof(epx_ll_output_bytes), 0, 0, 0, 0, 0 }
/* Bytes of each caller-allocated dispatch output for `hidden` (the buffer's if 0). */
EPX_API epx_status epx_ll_output_sizes(const epx_ll_buffer* buffer, int use_fp8, int use_ue8m0, int hidden,
                                       epx_ll_output_bytes* out);

/* LlRange */
typedef struct epx_ll_range {
  int32_t count, begin;
} epx_ll_range;

/* LlScalesLayout, in elements; all zero: row-major */
typedef struct epx_ll_scales_layout {
  int64_t expert_stride, row_stride, col_stride;
} epx_ll_scales_layout;

/* LlDispatchOutputs: caller-allocated, see epx_ll_output_sizes */
typedef struct epx_ll_dispatch_outputs {
  void* x;
  void* scales;
  epx_ll_scales_layout scales_layout;
  int32_t* recv_count;
  int32_t* src_idx;
  epx_ll_range* layout_range;
} epx_ll_dispatch_outputs;
#define EPX_LL_DISPATCH_OUTPUTS_NONE \
  { NULL, NULL, {0, 0, 0}, NULL, NULL, NULL }

/* LlHandle: what combine needs to know of a dispatch (the routing stays on the device); a plain value,
 * copy it freely. */
typedef struct epx_ll_handle {
  const void* buffer;
  int32_t set;
  uint64_t generation;
  int32_t num_tokens, topk, hidden;
  int32_t has_weights;
} epx_ll_handle;
#define EPX_LL_HANDLE_NONE \
  { NULL, 0, 0, 0, 0, 0, 0 }

typedef struct epx_ll_dispatch_args {
  size_t struct_size;
  epx_tensor x;            /* [T][H] bf16 */
  epx_tensor topk_idx;     /* [T][K] int64 or int32 */
  epx_tensor topk_weights; /* [in, optional] [T][K] float32 */
  int32_t use_fp8, round_scale, use_ue8m0;
  int32_t send_only; /* 1: the result carries a receive step */
  epx_ll_dispatch_outputs out;
  int32_t* cumulative_recv_count;  /* [in, optional] [E_local]: receive counts are added to it */
  int64_t* cumulative_wait_cycles; /* [in, optional] [R]: LlDispatchArgs::cumulative_wait_cycles */
} epx_ll_dispatch_args;
#define EPX_LL_DISPATCH_ARGS_INIT                                                                \
  {                                                                                              \
    sizeof(epx_ll_dispatch_args), EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_TENSOR_NONE, 1, 0, 0, 0, \
        EPX_LL_DISPATCH_OUTPUTS_NONE, NULL, NULL                                                 \
  }

typedef struct epx_ll_dispatch_result {
  size_t struct_size;
  epx_ll_handle handle;    /* [out] */
  cudaEvent_t finished;    /* [out] with async */
  epx_ll_receive* receive; /* [out] with send_only, else NULL */
} epx_ll_dispatch_result;
#define EPX_LL_DISPATCH_RESULT_INIT \
  { sizeof(epx_ll_dispatch_result), EPX_LL_HANDLE_NONE, NULL, NULL }

/* Collective. */
EPX_API epx_status epx_ll_dispatch(epx_ll_buffer* buffer, const epx_ll_dispatch_args* args, const epx_streams* streams,
                                   epx_ll_dispatch_result* result);

/* LlCombineOrder */
typedef enum epx_ll_combine_order { EPX_LL_COMBINE_LOCAL = 0, EPX_LL_COMBINE_NAIVE = 1 } epx_ll_combine_order;

typedef struct epx_ll_combine_args {
  size_t struct_size;
  epx_tensor y;            /* [E_local * C][H] bf16 */
  epx_tensor topk_weights; /* [T][K] float32: naive order, or local order after a dispatch without weights */
  epx_ll_handle handle;
  int32_t order; /* epx_ll_combine_order */
  int32_t send_only;
  epx_tensor out;                  /* [T][H] bf16, caller-allocated */
  int64_t* cumulative_wait_cycles; /* [in, optional] [R]: LlCombineArgs::cumulative_wait_cycles */
} epx_ll_combine_args;
#define EPX_LL_COMBINE_ARGS_INIT                                                                                \
  {                                                                                                             \
    sizeof(epx_ll_combine_args), EPX_TENSOR_NONE, EPX_TENSOR_NONE, EPX_LL_HANDLE_NONE, EPX_LL_COMBINE_LOCAL, 0, \
        EPX_TENSOR_NONE, NULL                                                                                   \
  }

typedef struct epx_ll_combine_result {
  size_t struct_size;
  cudaEvent_t finished;    /* [out] with async */
  epx_ll_receive* receive; /* [out] with send_only, else NULL */
} epx_ll_combine_result;
#define EPX_LL_COMBINE_RESULT_INIT \
  { sizeof(epx_ll_combine_result), NULL, NULL }

/* Collective. */
EPX_API epx_status epx_ll_combine(epx_ll_buffer* buffer, const epx_ll_combine_args* args, const epx_streams* streams,
                                  epx_ll_combine_result* result);
/* Launches the receive step on the stream its call ran on. A second run is refused. */
EPX_API epx_status epx_ll_receive_run(epx_ll_receive* receive);
EPX_API epx_status epx_ll_receive_release(epx_ll_receive* receive); /* NULL is accepted */
/* The buffer-owned place for combine's y, [E_local * C][H_max] bf16 (allocated on the first call). */
EPX_API epx_status epx_ll_combine_buffer(epx_ll_buffer* buffer, epx_tensor* out);
EPX_API epx_status epx_ll_check_errors(epx_ll_buffer* buffer);
/* Rank masking (LlBuffer::set_rank_masked, query_rank_mask, clear_rank_mask): local calls on `stream`.
 * query writes int32 [R] to device memory: 1 for a masked rank. */
EPX_API epx_status epx_ll_set_rank_masked(epx_ll_buffer* buffer, int rank, int masked, cudaStream_t stream);
EPX_API epx_status epx_ll_query_rank_mask(epx_ll_buffer* buffer, int32_t* out, cudaStream_t stream);
EPX_API epx_status epx_ll_clear_rank_mask(epx_ll_buffer* buffer, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* EPX_EPX_H */
