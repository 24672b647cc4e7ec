"""Upstream Mooncake's tensor object layout: a 304-byte TensorMetadata, then the raw data.

A tensor stored with put_tensor is one object: [TensorMetadata][contiguous data], the metadata
laid out exactly as upstream's `mooncake::TensorMetadata` (mooncake-integration/
integration_utils.h, little-endian, no padding), so that objects written by upstream's client
and by this one read back the same in either:

    TensorObjectHeader (40 B)                 TensorLayoutMetadata (264 B)
      u32 magic 0x4d4f4f4e ("NOOM")             i64 global_shape[8]  (unused dims -1)
      u16 version 1, u16 header_size 304        i64 local_shape[8]   (unused dims -1)
      i32 dtype (TensorDtype), i32 ndim         u32 axis_count, u32 reserved
      u32 layout_kind (0 FULL, 1 SHARD)         LayoutAxis axes[4] (32 B each):
      u32 reserved_flags 0                        i32 kind (0 DP, 1 TP, 2 EP, 3 PP, 4 RESERVED)
      u64 data_offset (304)                       i32 axis_index, shard_rank, shard_count,
      u64 data_bytes                              i32 split_dim (-1: none), reserved0
                                                  i64 reserved1 (local extent at split_dim)

The data holds `local_shape` (the whole tensor for FULL, one shard for SHARD). A parse accepts
only what upstream's ValidateTensorMetadata accepts. Only torch is needed, and only by the
functions that take or make tensors.
"""
import ctypes
import struct

MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
HEADER_SIZE = 304  # sizeof(TensorMetadata)

LAYOUT_FULL = 0
LAYOUT_SHARD = 1
AXIS_TP = 1

_HEADER = struct.Struct("<IHHiiIIQQ")   # 40 bytes
_SHAPE = struct.Struct("<8q")           # 64 bytes
_COUNTS = struct.Struct("<II")          # 8 bytes
_AXIS = struct.Struct("<6iq")           # 32 bytes
assert _HEADER.size + 2 * _SHAPE.size + _COUNTS.size + MAX_AXES * _AXIS.size == HEADER_SIZE

# TensorDtype value -> (torch dtype name, element size)
DTYPES = {
    0: ("float32", 4), 1: ("float64", 8), 2: ("int8", 1), 3: ("uint8", 1),
    4: ("int16", 2), 5: ("uint16", 2), 6: ("int32", 4), 7: ("uint32", 4),
    8: ("int64", 8), 9: ("uint64", 8), 10: ("bool", 1), 11: ("float16", 2),
    12: ("bfloat16", 2), 13: ("float8_e4m3fn", 1), 14: ("float8_e5m2", 1),
}
_CODE_OF_NAME = {name: code for code, (name, _) in DTYPES.items()}


class Metadata:
    """A parsed TensorMetadata. `axes` holds (kind, axis_index, shard_rank, shard_count,
    split_dim, reserved0, reserved1) tuples."""
    __slots__ = ("dtype", "ndim", "layout_kind", "data_offset", "data_bytes",
                 "global_shape", "local_shape", "axes")

    def __init__(self, dtype, global_shape, local_shape, data_bytes,
                 layout_kind=LAYOUT_FULL, axes=()):
        self.dtype = dtype
        self.ndim = len(local_shape)
        self.layout_kind = layout_kind
        self.data_offset = HEADER_SIZE
        self.data_bytes = data_bytes
        self.global_shape = tuple(global_shape)
        self.local_shape = tuple(local_shape)
        self.axes = tuple(axes)

    @property
    def element_size(self):
        return DTYPES[self.dtype][1]

    def torch_dtype(self, torch):
        return getattr(torch, DTYPES[self.dtype][0])

    def pack(self):
        """The 304 bytes of this metadata."""
        def shape(dims):
            return _SHAPE.pack(*(tuple(dims) + (-1,) * (MAX_DIMS - len(dims))))
        out = bytearray(HEADER_SIZE)
        _HEADER.pack_into(out, 0, MAGIC, VERSION, HEADER_SIZE, self.dtype, self.ndim,
                          self.layout_kind, 0, self.data_offset, self.data_bytes)
        out[40:104] = shape(self.global_shape)
        out[104:168] = shape(self.local_shape)
        _COUNTS.pack_into(out, 168, len(self.axes), 0)
        for i, axis in enumerate(self.axes):
            _AXIS.pack_into(out, 176 + i * _AXIS.size, *axis)
        return bytes(out)


def dtype_code(torch_dtype):
    """The TensorDtype of a torch dtype, or None when upstream has none for it."""
    return _CODE_OF_NAME.get(str(torch_dtype).rsplit(".", 1)[-1])


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def parse(raw, total_length):
    """The Metadata at the start of `raw` (bytes-like, at least HEADER_SIZE long) of an object
    of `total_length` bytes; None when it is not a valid tensor object (upstream's rules)."""
    if total_length < HEADER_SIZE or len(raw) < HEADER_SIZE:
        return None
    (magic, version, header_size, dtype, ndim, layout_kind, _flags, data_offset,
     data_bytes) = _HEADER.unpack_from(raw, 0)
    if magic != MAGIC or version != VERSION or header_size != HEADER_SIZE:
        return None
    if dtype not in DTYPES or not 0 <= ndim <= MAX_DIMS or layout_kind > LAYOUT_SHARD:
        return None
    axis_count, _ = _COUNTS.unpack_from(raw, 168)
    if axis_count > MAX_AXES:
        return None
    if not HEADER_SIZE <= data_offset <= total_length:
        return None
    if data_bytes != total_length - data_offset:
        return None
    g = _SHAPE.unpack_from(raw, 40)
    loc = _SHAPE.unpack_from(raw, 104)
    if any(d < 0 for d in g[:ndim] + loc[:ndim]):
        return None
    if any(d != -1 for d in g[ndim:] + loc[ndim:]):
        return None
    if data_bytes != _numel(loc[:ndim]) * DTYPES[dtype][1]:
        return None
    axes = []
    for i in range(axis_count):
        axis = _AXIS.unpack_from(raw, 176 + i * _AXIS.size)
        kind, _, rank, count, split_dim = axis[:5]
        if not 0 <= kind <= 4 or count <= 0 or not 0 <= rank < count:
            return None
        if not -1 <= split_dim < ndim:
            return None
        axes.append(axis)
    md = Metadata(dtype, g[:ndim], loc[:ndim], data_bytes, layout_kind, axes)
    md.data_offset = data_offset
    return md


def parse_prefix(raw):
    """parse() of an object known only by its first HEADER_SIZE bytes: its length is taken to
    be what the header says (data_offset + data_bytes); a read of its data checks that."""
    if len(raw) < HEADER_SIZE:
        return None
    data_offset, data_bytes = _HEADER.unpack_from(raw, 0)[7:9]
    return parse(raw, data_offset + data_bytes)


def parse_at(ptr, total_length):
    """parse() of the object at address `ptr` (its first HEADER_SIZE bytes are read)."""
    if not ptr or total_length < HEADER_SIZE:
        return None
    return parse(ctypes.string_at(ptr, HEADER_SIZE), total_length)


def full_metadata(tensor, code):
    shape = tuple(tensor.shape)
    return Metadata(code, shape, shape, tensor.numel() * tensor.element_size())


def shard_metadata(full_shape, shard, code, rank, size, split_dim):
    """Upstream's metadata of TP shard `rank` of `size` (put_tensor_with_tp)."""
    local = tuple(shard.shape)
    axis = (AXIS_TP, 0, rank, size, split_dim, 0, local[split_dim])
    return Metadata(code, full_shape, local, shard.numel() * shard.element_size(),
                    LAYOUT_SHARD, (axis,))


def view_memory(ptr, nbytes, owner=None):
    """A writable uint8 numpy array over `nbytes` at `ptr`, keeping `owner` alive."""
    import numpy as np
    arr = (ctypes.c_uint8 * nbytes).from_address(ptr) if nbytes else (ctypes.c_uint8 * 0)()
    arr._mc_owner = owner
    return np.frombuffer(arr, dtype=np.uint8)


def tensor_over(torch, md, ptr, owner=None):
    """A tensor of `md`'s dtype and local shape over the data of the object at `ptr` (no
    copy; `owner` is kept alive as long as the tensor)."""
    dtype = md.torch_dtype(torch)
    if md.data_bytes == 0:
        return torch.empty(md.local_shape, dtype=dtype)
    flat = torch.from_numpy(view_memory(ptr + md.data_offset, md.data_bytes, owner))
    return flat.view(dtype).reshape(md.local_shape)
