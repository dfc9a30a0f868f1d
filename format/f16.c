/* IEEE 754 binary32 -> binary16 (FORMAT.md: round to nearest, ties to even;
 * subnormals kept; overflow to Inf; NaN stays NaN; the other way is inline
 * in oscar_format.h). Pure
 * integer arithmetic so the result does not depend on the FPU rounding mode. */
#include "oscar_format.h"

uint16_t oscar_f32_to_f16(float f) {
    uint32_t u = oscar_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    /* 65520 (= 0x477ff000) is halfway between 65504 (odd mantissa) and 2^16:
     * ties to even rounds it up, so everything from there on is Inf. */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below the smallest normal half (2^-14) */
        uint32_t e = a >> 23;
        if (e < 102u) return sign; /* < 2^-25: rounds to zero */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24: half units of 2^-24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r); /* r == 0x400 is the smallest normal: correct */
    }
    /* Normal: rebias the exponent and round the 13 dropped mantissa bits; a
     * carry propagates into the exponent, which is the correct result. */
    uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) >> 13;
    return (uint16_t)(sign | (r - (112u << 10)));
}
