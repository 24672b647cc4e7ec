"""The tensors of the tensor-layout fixtures (tests/python/fixtures/upstream_tensors/): each
case is built deterministically (no random numbers), so that the recorder, run with upstream's
wheel, and the tests, run with this package, make the same tensor from its name.

CASES: name -> (builder, how it was stored). `how` is ("put",) for put_tensor, or
("tp", tp_size, split_dim) for put_tensor_with_tp (the shard keys <key>_tp_<rank> are recorded).
"""


def _arange(torch, shape, dtype):
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return (torch.arange(n) % 3 == 0).reshape(shape)
    base = torch.arange(n, dtype=torch.float64) * 0.75 - n / 3
    if not dtype.is_floating_point:
        base = torch.arange(n, dtype=torch.int64) * 37 - n * 5
        if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
            base = base.abs()
        info = torch.iinfo(dtype)
        base = base.clamp(max(info.min, -2**63), min(info.max, 2**63 - 1))
    return base.to(dtype).reshape(shape)


def build(torch, name):
    """The tensor of case `name`."""
    spec = CASES[name]
    dtype = getattr(torch, spec[0])
    return _arange(torch, spec[1], dtype)


# name: (torch dtype name, shape, how)
CASES = {
    "f32_2x3": ("float32", (2, 3), ("put",)),
    "f64_4": ("float64", (4,), ("put",)),
    "i8_3x2x2": ("int8", (3, 2, 2), ("put",)),
    "u8_5": ("uint8", (5,), ("put",)),
    "i16_2x2": ("int16", (2, 2), ("put",)),
    "u16_3": ("uint16", (3,), ("put",)),
    "i32_2x1x3": ("int32", (2, 1, 3), ("put",)),
    "u32_2": ("uint32", (2,), ("put",)),
    "i64_3": ("int64", (3,), ("put",)),
    "u64_2": ("uint64", (2,), ("put",)),
    "bool_7": ("bool", (7,), ("put",)),
    "f16_2x4": ("float16", (2, 4), ("put",)),
    "bf16_3x3": ("bfloat16", (3, 3), ("put",)),
    "f8e4m3_4": ("float8_e4m3fn", (4,), ("put",)),
    "f8e5m2_2x2": ("float8_e5m2", (2, 2), ("put",)),
    "f32_scalar": ("float32", (), ("put",)),
    "f32_empty_0": ("float32", (0,), ("put",)),
    "i64_empty_2x0x3": ("int64", (2, 0, 3), ("put",)),
    "f32_8d": ("float32", (1, 2, 1, 2, 1, 2, 1, 2), ("put",)),
    "f32_tp2_dim0": ("float32", (4, 3), ("tp", 2, 0)),
    "bf16_tp4_dim1": ("bfloat16", (2, 8), ("tp", 4, 1)),
    "i32_tp3_dim2": ("int32", (2, 2, 6), ("tp", 3, 2)),
}
