/* backend/cpu/features: what this CPU can run, read once from cpuid, with
 * OSP_ISA applied: "scalar" turns every vector tier off, "avx2" the AVX-512
 * ones (so a CPU's fallbacks can be tested on a machine that has more).
 * The one place the CPU backend asks about the CPU. */
#ifndef OSP_CPU_FEATURES_H
#define OSP_CPU_FEATURES_H

typedef struct osp_cpu_features {
    int avx2;    /* AVX2 + FMA + F16C */
    int avx512;  /* AVX-512 F + BW + VL + DQ */
    int vnni;    /* avx512 + AVX512-VNNI (the int8 matmul path) */
    const char *forced; /* OSP_ISA's value, or NULL */
} osp_cpu_features;

const osp_cpu_features *osp_cpu_features_get(void);

#endif
