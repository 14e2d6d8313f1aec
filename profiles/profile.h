/* prof — device and cluster profiles: what one accelerator can do (memory, peak FLOP/s per
 * precision, memory bandwidth) and how devices are connected (devices per node, the node's link,
 * the network per device). Built-in profiles live in profiles/devices and profiles/clusters and
 * are compiled in; a path to a JSON file is read from disk. Every figure cites its source in
 * the file's "sources" object; docs/profiles.md explains the choices.
 *
 * Example:
 *   ProfCluster cl;
 *   const char *sets[] = {"network.bandwidth_per_device=100e9"};
 *   if (prof_cluster_load("dgx-a100", sets, 1, &cl, &err)) ...
 *   double peak = prof_peak_flops(&cl.device, PX_BF16);     // 312e12
 */
#ifndef PROF_H
#define PROF_H

#include <stdint.h>

#include "common/px.h"

typedef struct {
    char name[64];
    char description[160];
    uint64_t memory_bytes; /* usable device memory */
    double peak_fp32, peak_tf32, peak_bf16, peak_fp16, peak_fp8; /* dense FLOP/s; 0: none */
    double memory_bandwidth; /* bytes/s */
    int sm_count;            /* streaming multiprocessors (or cores for a CPU) */
    uint64_t runtime_bytes;  /* fixed per-process memory: context, library workspaces */
    /* efficiency model (docs/time.md) */
    double matmul_eff;       /* fraction of the dense peak a large, aligned GEMM reaches */
    double matmul_k_half;    /* K at which a GEMM's main loop reaches half its efficiency */
    double misaligned_eff;   /* factor when n or k is not a multiple of 16 bytes of elements */
    int n_tiles;             /* output tile shapes the GEMM library chooses among */
    double tile_m[8], tile_n[8], tile_eff[8];
    double clock_headroom;   /* boost over the sustained GEMM clock: how much faster the busy SMs
                              * of a partial wave may run on the power the idle ones leave; 1:
                              * none, every partial wave costs a full one (docs/time.md) */
    double memory_eff;       /* fraction of memory_bandwidth streaming kernels reach */
    double memory_attn_eff;  /* memory_attention: what the unfused attention core's softmax and
                              * dropout over the s x s scores reach; absent: memory_eff */
    double attn_fwd_eff;     /* fused (flash) attention: fraction of the dense peak, forward */
    double attn_bwd_eff;     /* and backward */
    double attn_fa2_fwd_eff; /* FlashAttention-2's kernels (a framework on PyTorch's SDPA of 2024):
                              * attention_fa2_fwd; absent: attention_fwd */
    double attn_fa2_bwd_eff; /* and backward: attention_fa2_bwd; absent: attention_bwd */
    double kernel_overhead_s; /* fixed cost of one kernel launch */
    double host_sync_s;      /* a device-to-host copy the host waits for (a MoE dispatcher's
                              * token counts): the copy, the wait and the launch after it while
                              * the drained device idles; absent: 0 (docs/time.md) */
    /* FP8 training (docs/profiles.md, "FP8 and MXFP8") */
    double peak_mxfp8;       /* peak_flops.mxfp8: dense MXFP8 FLOP/s (FP8 elements, one E8M0
                              * scale per 32); 0: no MXFP8 tensor cores (Hopper, Ada, Ampere) */
    double eff_matmul_fp8;   /* efficiency.matmul_fp8: what matmul_eff is to the bf16 peak, for an
                              * FP8 or MXFP8 GEMM against its own peak. It replaces matmul_eff
                              * only; the shape terms stay shared: e = eff_matmul_fp8 x tile
                              * utilisation (tiles) x k/(k + matmul_k_half) x misaligned.
                              * Absent: matmul_eff */
    int fp8_transpose;       /* fp8_tn_only: FP8 tensor-core GEMMs take only the TN layout (A
                              * transposed, B not: cuBLASLt on Hopper and Ada), so FP8 training
                              * keeps a transposed FP8 copy of the operands its backward GEMMs
                              * read the other way; 0 on Blackwell, which takes any layout */
} ProfDevice;

/* What `parallax calibrate` measured on a machine: GEMM timings at the op graph's shapes, the
 * rate and fixed cost fitted per kind of op (over the simulator's own bytes or FLOPs for that
 * op), and collective times against message size per group size. The simulator prefers these
 * to the analytic model wherever they apply (docs/time.md, "Calibrated profiles"). */
/* Every GEMM point and op rate records how many ranks ran at once on the machine while it was
 * measured (its concurrency: they share caches and memory bandwidth); a lookup uses the level
 * nearest to the job's ranks per node. */
typedef struct {
    double m, n, k, batch, seconds;
    int concurrency;
} ProfGemmPoint;

typedef struct {
    char kind[16];  /* an op kind: matmul (its non-GEMM part), attention, norm, activation, ... */
    char phase[16]; /* fwd, bwd (recompute uses fwd), step */
    int flash;      /* attention only: the fused kernel */
    char variant[24]; /* what of the model changes the op's speed (ModelOpKey); "": any */
    double rate;    /* bytes/s, or FLOP/s for attention */
    double overhead_s;
    int concurrency;
    int points;     /* samples the rate was fitted to (0: not recorded) */
} ProfOpRate;

#define PROF_MAX_POINTS 48
typedef struct {
    char op[16]; /* allreduce, all_gather, reduce_scatter, sendrecv */
    int ranks, nodes;
    int n;
    double bytes[PROF_MAX_POINTS], seconds[PROF_MAX_POINTS];
} ProfCollective;

typedef struct {
    char host[64];
    char date[32];
    int ranks; /* the most ranks that ran concurrently while measuring (the default concurrency) */
    /* one rank alone: the best rate of a square GEMM and a streaming add's bandwidth, the
     * figures `parallax validate` probes again to see whether the host still runs as fast
     * (0: not recorded, profiles calibrated before they were) */
    double peak_flops, memory_bandwidth;
    int quick; /* measured by `calibrate --quick` (a smaller GEMM, fewer repetitions) */
    ProfGemmPoint *gemm;
    int n_gemm;
    ProfOpRate *ops;
    int n_ops;
    ProfCollective *coll;
    int n_coll;
} ProfMeasured;

typedef struct {
    char name[64];
    char description[160];
    ProfDevice device;
    int node_devices;      /* devices per node; 0: every rank on one node */
    double link_bandwidth; /* intra-node bytes/s per device per direction */
    double link_latency;   /* seconds */
    double net_bandwidth;  /* inter-node bytes/s per device per direction */
    double net_latency;
    double link_eff;       /* fraction of link_bandwidth a collective's bus bandwidth reaches */
    double net_eff;        /* fraction of net_bandwidth */
    double net_a2a_eff;    /* fraction of net_bandwidth NCCL's all-to-all (grouped send/receive) reaches
                            * across nodes; network.all_to_all_efficiency, net_eff when not given */
    double overlap_slowdown; /* compute slowdown while communication overlaps it (shared SMs and memory) */
    int nodes;         /* nodes in the cluster; 0: no limit */
    int shared_memory; /* ranks of a node share one memory (CPU ranks): memory_bytes is per node */
    /* The host side of a node, for optimizer and activation offload (docs/profiles.md, "Host");
     * 0: not described, offload is refused */
    double host_memory_bytes;     /* host.memory_bytes: the node's host memory */
    double host_pcie_bandwidth;   /* host.pcie_bandwidth: bytes/s per device per direction */
    double host_memory_bandwidth; /* host.memory_bandwidth: the node's bytes/s, shared by its ranks */
    int host_cores;               /* host.cores: CPU cores of the node (reported) */
    ProfMeasured *measured; /* calibrated profiles only (owned; copies share it read-only) */
} ProfCluster;

/* Loads a built-in device ("a100-80gb") or a device JSON file. */
int prof_device_load(const char *name_or_path, ProfDevice *out, PxError *err);
/* Where this machine's calibrated profile is: local-<hostname>.json in $PARALLAX_PROFILE_DIR,
 * ./profiles or the profiles/ beside the build directory, the first that has it (returns 1);
 * else where `parallax calibrate` writes it (returns 0): $PARALLAX_PROFILE_DIR, else the
 * profiles/ beside the build directory when it exists, else ./profiles. Absolute where the
 * folder exists. */
int prof_calibrated_path(char *buf, size_t cap);
/* Loads a built-in cluster ("dgx-a100") or a cluster JSON file, resolves its device, then
 * applies `key=value` overrides (dotted paths into the cluster JSON, device included:
 * "device.peak_flops.bf16=400e12"). `local` is this machine's calibrated profile when one
 * exists (unless PARALLAX_UNCALIBRATED is set), else the generic built-in one. PX_EINPUT names
 * the file, key or override at fault. */
int prof_cluster_load(const char *name_or_path, const char *const *sets, int n_sets,
                      ProfCluster *out, PxError *err);
/* The same from JSON text (origin names it in messages). */
int prof_device_parse(const char *text, const char *origin, ProfDevice *out, PxError *err);
int prof_cluster_parse(const char *text, const char *origin, ProfCluster *out, PxError *err);
/* The same from parsed JSON: a plan's inline profile, as prof_cluster_to_json wrote it. */
int prof_cluster_from_json(const cJSON *j, const char *origin, ProfCluster *out, PxError *err);
/* A copy with its own measurements (a plain struct copy shares them): free both. */
int prof_cluster_copy(const ProfCluster *src, ProfCluster *out, PxError *err);
int prof_device_count(void);
const char *prof_device_name(int i);
int prof_cluster_count(void);
const char *prof_cluster_name(int i);
/* Dense peak FLOP/s for matmuls in dtype t (fp32 uses the fp32 figure, not TF32; PX_FP8 the
 * per-tensor-scaled FP8 figure). */
double prof_peak_flops(const ProfDevice *d, PxDtype t);
/* Dense peak FLOP/s of MXFP8 GEMMs (PX_FP8 elements with block scales); 0 when the device has
 * no MXFP8 tensor cores. MXFP8 is a scaling recipe, not a dtype: PxDtype stays as it is. */
double prof_peak_mxfp8(const ProfDevice *d);
/* The large-GEMM efficiency for dtype t before the shape terms: eff_matmul_fp8 for PX_FP8 (FP8
 * or MXFP8), matmul_eff otherwise. */
double prof_matmul_eff(const ProfDevice *d, PxDtype t);
/* The memory one rank may use: memory_bytes, divided among ranks_per_node for shared memory. */
uint64_t prof_rank_memory(const ProfCluster *c, int ranks_per_node);
/* Host memory one rank may use for offload: host.memory_bytes over the ranks of a node
 * (ranks_per_node); 0 when the profile describes no host. */
uint64_t prof_host_rank_memory(const ProfCluster *c, int ranks_per_node);
/* Devices per node for a job of `gpus` ranks (node_devices, or gpus when unbounded). */
int prof_node_size(const ProfCluster *c, int gpus);
/* 1 when the device is a CPU: the profile named cpu (a calibrated CPU profile keeps its device's
 * name), or a device without 16-bit tensor throughput. The executor trains such a plan on the
 * CPU backend, and its Slurm export asks for no GPUs. */
int prof_device_is_cpu(const ProfDevice *d);
/* Everything the simulator reads of the profile (the device inline, the measurements
 * included), numbers written so that they read back exactly: prof_cluster_from_json of it
 * gives the same predictions. */
cJSON *prof_cluster_to_json(const ProfCluster *c);
/* Frees what a loaded cluster owns (its measurements); accepts a cluster without any. */
void prof_cluster_free(ProfCluster *c);
void prof_measured_free(ProfMeasured *m);
/* The `measured` section (docs/formats.md) from JSON; `where` names its object in messages
 * ("p.json:" gives "p.json: measured.gemm[3]: ..."). A GEMM row or op rate without its own
 * concurrency takes the section's `ranks` (1 when absent). *out is the caller's (free it with
 * prof_measured_free); PX_EINPUT names the key at fault, and nothing is left allocated. */
int prof_measured_from_json(const cJSON *me, const char *where, ProfMeasured **out,
                            PxError *err);
/* The section as JSON, every entry with its concurrency, numbers written so that they read
 * back exactly (prof_cluster_to_json writes it so). Caller frees with cJSON_Delete. */
cJSON *prof_measured_to_json(const ProfMeasured *m);
/* Adds copies of from's GEMM points, op rates and collectives after into's own (host, date and
 * ranks stay into's). PX_ERUNTIME when out of memory, into's entries unchanged. */
int prof_measured_append(ProfMeasured *into, const ProfMeasured *from, PxError *err);
/* A collective's measured time for `bytes` over `ranks` ranks on `nodes` nodes, interpolated
 * log-log between measured sizes; a negative value when nothing was measured for it. */
double prof_measured_collective(const ProfMeasured *m, const char *op, int ranks, int nodes,
                                double bytes);
/* The measured rate of an op kind and phase with `concurrency` ranks running on the machine
 * (the nearest level measured for it): of the variant asked for when one was measured, else
 * of another variant of the same op; NULL when none. A context-parallel ring's attention core
 * (a variant ending "/ring") and the whole core's never stand for each other. */
const ProfOpRate *prof_measured_op(const ProfMeasured *m, const char *kind, const char *phase,
                                   int flash, const char *variant, int concurrency);
/* A GEMM's measured time at the nearest concurrency level: the shape itself, or the nearest
 * measured shape (log distance) scaled by FLOPs; a negative value when nothing was measured. */
double prof_measured_gemm(const ProfMeasured *m, double M, double N, double K, double batch,
                          int concurrency);

/* What the framework that runs a job does beyond the layout's knobs, from its built-in file
 * profiles/frameworks/<name>.json (docs/profiles.md, "Frameworks"): selective recompute as
 * Megatron's (the attention core) or op-level (recompute_op 1: every other matmul and every
 * elementwise op recomputed), and whether it always overlaps data-parallel communication
 * (overlap_dp 1; -1: the layout's --overlap-dp), and whether its norms run as eager Python
 * modules where the job is not compiled (eager_norms), and whether its attention runs
 * FlashAttention-2's kernels (flash_attention_2), and what its eager rotary embedding moves
 * (eager_rope_bytes, eager_rope_kernels), and what its AdamW step moves (adamw_step_bytes),
 * and which layouts it runs at all (zero_stages, zero_stages_pp, cp_comm_types, moe_dispatchers,
 * dp_only).
 * PX_EINPUT names an unknown framework or a malformed file. */
typedef struct {
    char name[32];
    int recompute_op;
    int overlap_dp;
    int eager_norms; /* its norms are Python modules: unfused unless compiled */
    int flash_attention_2; /* its attention runs FlashAttention-2's kernels (PyTorch's SDPA of
                            * 2024), at the device's attention_fa2_* rates */
    /* its rotary embedding as eager PyTorch runs it where the job is not compiled: bytes moved
     * per element of the queries and keys, and kernels per tensor, in each pass (0: priced as
     * fused into the QKV projection's epilogue, at no cost) */
    double eager_rope_bytes;
    int eager_rope_kernels;
    /* bytes its AdamW step moves per element of the rank's optimizer shard, the gradient norm
     * and the clipping included, where it runs PyTorch's multi-tensor (foreach) AdamW on fp32
     * gradients (0: parallax's fused count, model/ops.c's step_optimizer) */
    double adamw_step_bytes;
    /* the layouts it runs (docs/profiles.md, "Frameworks"; 0 where the file does not say: every
     * one): bit z of zero_stages for ZeRO-z, of zero_stages_pp for ZeRO-z with pp > 1;
     * cp_comm_types the context-parallel kinds by name (n_cp_comm_types 0: all); dp_only 1: data
     * parallelism only, no tp, pp, cp or ep */
    unsigned zero_stages, zero_stages_pp, zero_stages_cp; /* _cp: with cp > 1 (0: as zero_stages) */
    char cp_comm_types[4][16];
    int n_cp_comm_types;
    char moe_dispatchers[4][16]; /* the MoE dispatchers it runs by name (n 0: all) */
    int n_moe_dispatchers;
    int dp_only;
} ProfFramework;
int prof_framework_load(const char *name, ProfFramework *out, PxError *err);

#endif
