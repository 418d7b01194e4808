/*
 * attncc/abi.h: the C ABI between a generated kernel library and its host.
 *
 * Every generated shared library exports
 *
 *     int attncc_abi_version(void);                ATTNCC_ABI_VERSION the library was built with
 *     int attncc_args_size(void);                  sizeof(AttnccArgs) the library was built with
 *     int attncc_launch(const AttnccArgs* args);   returns a cudaError_t
 *     int attncc_smem_bytes(void);                 dynamic shared memory of the decode kernel
 *     int attncc_threads(void);                    threads per decode CTA
 *     int attncc_ctas_per_split(int s_q);          decode CTAs per (batch[, query token], split)
 *     int attncc_ctas_per_sm(void);                decode CTAs one SM holds at once (0: unknown)
 *     int attncc_write_args_size(void);            sizeof(AttnccWriteArgs) the library was built with
 *     int attncc_write_cache(const AttnccWriteArgs* args);  write_cache's kernel; a cudaError_t
 *     int attncc_plan_schedule(const AttnccArgs* args, void* lines);  a step's schedule; a cudaError_t
 *
 * and nothing else; the host (Python, through ctypes or a thin binding) fills this struct with
 * device pointers and sizes, after checking the first two (and the write size) against its own (attncc/abi.py reads
 * the version and the tensor limit from this file: they are defined here only). Any change to
 * AttnccArgs or to the meaning of a field bumps ATTNCC_ABI_VERSION. Plain C: no C++ here.
 *
 * Tensor conventions (DESIGN.md section 3). q, out, lse, block_table rows, seqlens, indices and
 * the workspace are contiguous. A cache tensor may be a view (DESIGN.md section 3a): its
 * innermost dimension contiguous, its base and its page, token and head strides (bytes, in
 * page_stride, token_stride, head_stride; head_stride only for a tensor with a head axis)
 * multiples of 16. d_k, d_v, h_q, h_kv, page size, top-k and the record layout are
 * compile-time properties of the library.
 *
 * Values are checked on the device, never read back by the host: a page number outside
 * [0, num_pages), a length outside [0, block_table_cols * page size], a sparse index outside
 * [-1, num_pages * page size) is not dereferenced (its tokens count as absent, a length is
 * clamped) and ORs its ATTNCC_FLAG_* bit into *flags (when flags is not NULL).
 * Workspace (attncc/split.py's workspace_shapes is the host's one statement of it):
 *   split mode  partial_out [num_splits, b, s_q, h_q, d_v], partial_lse [num_splits, b, s_q, h_q]
 *   part mode   partial_out [2 num_parts, 1, s_q, h_q, d_v], partial_lse [2 num_parts, 1, s_q, h_q]
 *               then int32 ready words [2 num_parts, lanes] (core/ready.cuh; lanes: row blocks x
 *               kv heads) and one int32 word (whether the parts hold whole sequences), in
 *               partial_lse's allocation
 */
#ifndef ATTNCC_ABI_H_
#define ATTNCC_ABI_H_

#ifdef __cplusplus
extern "C" {
#endif

#define ATTNCC_ABI_VERSION 4
#define ATTNCC_MAX_TENSORS 8
#define ATTNCC_MAX_SEGMENTS 8  /* segments of a record write_cache's kernel takes (more: torch ops) */

/* bits of *flags (attncc/devicecheck.py names the argument of each) */
#define ATTNCC_FLAG_SLOT 1    /* write_cache's slots: a slot outside [0, num_pages * page size), not -1 */
#define ATTNCC_FLAG_PAGE 2    /* block_table: a page number outside [0, num_pages) */
#define ATTNCC_FLAG_SEQLEN 4  /* seqlens: a length outside [0, block_table_cols * page size] */
#define ATTNCC_FLAG_INDEX 8   /* indices: an index outside [-1, num_pages * page size) */
#define ATTNCC_FLAG_SCHEDULE 16  /* schedule: made for other lengths or shapes (not used: the CTAs cut the line) */

/* bytes of a part's line in a schedule (core/work.cuh ScheduleLine) */
#define ATTNCC_SCHEDULE_LINE_BYTES 48

typedef struct AttnccArgs {
  const void* q;          /* [b, s_q, h_q, d_k] elem */
  void* out;              /* [b, s_q, h_q, d_v] elem */
  float* lse;             /* [b, h_q, s_q] float32, natural log; -inf for a query that sees nothing */
  const void* tensors[ATTNCC_MAX_TENSORS]; /* the plan's cache tensors, in plan order; 16-byte aligned */
  int page_stride[ATTNCC_MAX_TENSORS];  /* bytes from a page of tensors[i] to the next (< 2^31) */
  int token_stride[ATTNCC_MAX_TENSORS]; /* bytes from a token of a page to the next (< 2^31) */
  int head_stride[ATTNCC_MAX_TENSORS];  /* bytes from a kv head to the next (0: no head axis; < 2^31) */
  int num_pages;          /* pages of every cache tensor (its first dimension) */
  const int* block_table; /* [b, block_table_cols] int32 page numbers, rows block_table_stride apart; NULL when sparse */
  int block_table_stride; /* in elements */
  int block_table_cols;   /* page numbers in a row; block_table_cols * page size < 2^31 */
  const int* seqlens;     /* [b] int32: cached length including the s_q new tokens; unused when sparse */
  const int* indices;     /* sparse only: [b, s_q, topk] int32 slots (page * P + offset), -1 = none */
  float* partial_out;     /* workspace [num_splits, b, s_q, h_q, d_v] float32 (split mode), or
                             [2 num_parts, s_q, h_q, d_v] (part mode); NULL when neither is > 1 / > 0 */
  float* partial_lse;     /* workspace [num_splits, b, s_q, h_q] or [2 num_parts, s_q, h_q] float32
                             (part mode: then the ready words, above) */
  int batch, s_q;
  int num_splits;         /* split mode: each sequence's tiles in this many equal ranges (1 when num_parts > 0) */
  int num_parts;          /* part mode when > 0: all sequences' tiles cut into this many equal parts
                             (attncc/schedule.cuh); the grid is num_parts x (row blocks x kv heads) */
  const void* schedule;   /* part mode: the step's schedule, num_parts lines that attncc_plan_schedule
                             wrote for these lengths and shapes (k.plan(seqlens)), or NULL: the CTAs
                             cut the line themselves (also where the schedule's key does not match) */
  float softmax_scale;    /* natural scale; the kernel uses scale * log2(e) with exp2 */
  int* flags;             /* device word the value checks OR their ATTNCC_FLAG_* bits into, or NULL */
  void* stream;           /* cudaStream_t */
} AttnccArgs;

/* write_cache (DESIGN.md section 3): token i's record, every segment, quantized where fp8
 * (scale = amax / max finite per scale group, values / scale rounded to nearest even and
 * clamped to the finite range), stored at slot slots[i] (page * P + offset) of the cache
 * tensors, at the views' strides (as in AttnccArgs). A slot of -1 is skipped; any other slot
 * outside [0, num_pages * page size) is skipped and sets ATTNCC_FLAG_SLOT in *flags. Two
 * entries with one slot store one of them or a mix (as any scatter). One kernel, no host sync. */
#define ATTNCC_VALUES_F32 0
#define ATTNCC_VALUES_BF16 1
#define ATTNCC_VALUES_F16 2
typedef struct AttnccWriteArgs {
  void* tensors[ATTNCC_MAX_TENSORS];    /* the plan's cache tensors, in plan order */
  int page_stride[ATTNCC_MAX_TENSORS];  /* bytes, as in AttnccArgs */
  int token_stride[ATTNCC_MAX_TENSORS];
  int head_stride[ATTNCC_MAX_TENSORS];
  int num_pages;
  const void* slots;                    /* [n] int32 or int64 */
  int slots_are_64bit;
  int n;
  const void* values[ATTNCC_MAX_SEGMENTS];  /* per segment in spec order: [n, copies, dim], the last dim contiguous */
  int value_dtype[ATTNCC_MAX_SEGMENTS];     /* ATTNCC_VALUES_* */
  long long value_token_stride[ATTNCC_MAX_SEGMENTS];  /* elements */
  long long value_head_stride[ATTNCC_MAX_SEGMENTS];   /* elements (0 for a shared segment) */
  int* flags;                           /* device word for ATTNCC_FLAG_SLOT, or NULL */
  void* stream;                         /* cudaStream_t */
} AttnccWriteArgs;

/* Exported by every generated library (see the top of this file). */
int attncc_abi_version(void);
int attncc_args_size(void);
int attncc_launch(const AttnccArgs* args);
int attncc_smem_bytes(void);
int attncc_threads(void);
int attncc_ctas_per_split(int s_q);
int attncc_ctas_per_sm(void);
int attncc_write_args_size(void);
int attncc_write_cache(const AttnccWriteArgs* args);
/* k.plan(seqlens) on the device: part mode's line of each of args->num_parts parts for the
 * lengths at args->seqlens (clamped to args->block_table_cols pages; 0: unclamped), batch and
 * s_q, into lines (num_parts * ATTNCC_SCHEDULE_LINE_BYTES, 16-byte aligned), on args->stream;
 * the other fields are not read. */
int attncc_plan_schedule(const AttnccArgs* args, void* lines);

#ifdef __cplusplus
}
#endif

#endif /* ATTNCC_ABI_H_ */
