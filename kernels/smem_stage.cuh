// smem_stage.cuh — PTX wrappers for kernels that stage operands in shared memory: cp.async
// copies (16-byte, N-byte, and 4-byte with a zero-filled tail), their commit / wait, ldmatrix
// x4 / x2, and SLd (qtypes.cuh's meta loader reading shared memory). A verbatim copy of
// gemm.cu's own wrappers, included by mvt.cu's layout 1 (MVT_LAYOUT 1). gemm.cu keeps its copy
// for now: including this header instead changes gemm.cu's source hash and so invalidates its
// tuning-table entries; move it onto this header (deleting its copy) when gemm.cu's entries are
// next re-frozen.
//
// Include after common.cuh.
#pragma once

MEMRA_DEVICE uint32_t smem_u32(const void* p) {
    uint32_t a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
MEMRA_DEVICE void cp16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
template <int N>
MEMRA_DEVICE void cpn(uint32_t dst, const void* src) {   // N = 4, 8, 16 bytes
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(dst), "l"(src), "n"(N) : "memory");
}
// 4-byte copy reading only `n` (<= 4) source bytes, the rest zero-filled
MEMRA_DEVICE void cp4n(uint32_t dst, const void* src, int n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
MEMRA_DEVICE void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
MEMRA_DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

MEMRA_DEVICE void ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MEMRA_DEVICE void ldsm2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// The meta fields read from shared memory (qtypes.cuh's load_meta through this loader).
struct SLd {
    static MEMRA_DEVICE uint4 l16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
    static MEMRA_DEVICE uint2 l8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
    static MEMRA_DEVICE uint32_t l4(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
    static MEMRA_DEVICE uint32_t l2(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
};
