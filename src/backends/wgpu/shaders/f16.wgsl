// The f16 conversion every kernel that reads stored f16 shares: an f16's bits as f32, exactly,
// by bit operations. `unpack2x16float` would need a capability that Mesa's Vulkan lacks
// without shader-f16. Prepended to the kernels that use it (WGSL has no includes).
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // Zero or subnormal: m * 2^-24, exact in f32.
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604645e-8));
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}
