/* safetensors_convert.c — safetensors tensor bytes to fp32
 * (zb_safetensors.h). Every F16 and BF16 value has an exact fp32 value, so
 * the conversions are bit manipulations with no rounding: BF16 is the top
 * half of an fp32; F16 widens its exponent (a subnormal F16 becomes a
 * normal fp32) and keeps NaN payloads. Bytes are read little-endian
 * whatever the host. */
#include <math.h>
#include <string.h>

#include "zb_safetensors.h"

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float zb_st_bf16_to_f32(uint16_t b) {
  return bits_f32((uint32_t)b << 16);
}

float zb_st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) /* infinity or NaN: all-ones exponent, payload kept */
    return bits_f32(sign | 0x7f800000u | mant << 13);
  if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in fp32 */
    float m = ldexpf((float)mant, -24);
    return sign ? -m : m;
  }
  return bits_f32(sign | (exp - 15 + 127) << 23 | mant << 13);
}

zb_err zb_st_decode_f32(zb_st_dtype dtype, const uint8_t *src, size_t count, float *dst, zb_diag *diag) {
  switch (dtype) {
  case ZB_ST_F32:
    for (size_t i = 0; i < count; i++, src += 4)
      dst[i] = bits_f32((uint32_t)src[0] | (uint32_t)src[1] << 8 | (uint32_t)src[2] << 16 |
                        (uint32_t)src[3] << 24);
    return ZB_OK;
  case ZB_ST_F16:
    for (size_t i = 0; i < count; i++, src += 2)
      dst[i] = zb_st_f16_to_f32((uint16_t)(src[0] | src[1] << 8));
    return ZB_OK;
  case ZB_ST_BF16:
    for (size_t i = 0; i < count; i++, src += 2)
      dst[i] = zb_st_bf16_to_f32((uint16_t)(src[0] | src[1] << 8));
    return ZB_OK;
  default:
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                       "safetensors: dtype %s does not convert to fp32 (only F32, F16 and BF16 do)",
                       zb_st_dtype_name(dtype));
  }
}

zb_err zb_st_to_f32(const uint8_t *bytes, size_t len, const zb_st_tensor *x, float *dst, size_t n,
                    zb_diag *diag) {
  if (n != x->numel)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: tensor \"%.100s\" has %llu elements, not %zu",
                       x->name, (unsigned long long)x->numel, n);
  if (x->offset > len || x->nbytes > len - x->offset)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "safetensors: tensor \"%.100s\" (bytes %llu..%llu) lies past the %zu bytes given",
                       x->name, (unsigned long long)x->offset, (unsigned long long)(x->offset + x->nbytes),
                       len);
  zb_err err = zb_st_decode_f32(x->dtype, bytes + x->offset, n, dst, diag);
  if (err != ZB_OK)
    return zb_diag_set(diag, err, "safetensors: tensor \"%.100s\": dtype %s does not convert to fp32",
                       x->name, zb_st_dtype_name(x->dtype));
  return ZB_OK;
}
