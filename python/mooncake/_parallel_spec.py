"""The request types of the `*_with_parallelism` tensor family and what upstream Mooncake
derives from them: shard key names, shard metadata axes, and the 96-byte shard manifest.

A shard is named by its axes (upstream's store_py_internal.h):

    one TP axis only        "<key>_tp_<rank>"            (the *_with_tp name)
    any other axis list     "<key>__<axis>__<axis>..."   axes sorted DP, TP, EP, PP, each
                            "<kind>_<rank>of<size>[_sd<split_dim>][_eid<expert_id>][_sid<stage_id>]"
    writer_partition        "<key>__writer_<rank>of<size>_sd<split_dim>"

A TP write also stores a manifest under "<key>__parallelism_manifest" (a writer_partition
write: "<key>__writer_manifest"), little-endian, 96 bytes:

    u32 magic 0x574d414e ("NAMW"), u16 version 1, u16 header_size 96, i32 dtype (TensorDtype),
    i32 ndim, i32 split_dim, i32 shard_count, i32 reserved0 0, 4 bytes of padding (0),
    i64 global_shape[8] (unused dims -1)

Validation follows upstream's validate_parallelism_spec: 1-4 axes of distinct kinds among
tp/dp/ep/pp (any case), 0 <= rank < size; TP needs split_dim; DP, EP and PP take none; EP
needs expert_id, PP needs stage_id. Every parse returns None (and logs) for a bad request.
"""
import logging
import operator
import struct

from . import _tensor_layout as layout

log = logging.getLogger("mooncake.store")

KIND_CODES = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}   # LayoutAxisKind
_KIND_NAMES = {v: k for k, v in KIND_CODES.items()}
_CANONICAL_ORDER = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}
READ_MODES = ("as_stored", "shard", "full")

MANIFEST_MAGIC = 0x574D414E
MANIFEST_SIZE = 96
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
assert _MANIFEST.size == MANIFEST_SIZE


class ParallelAxis:
    """One parallel axis of a shard: kind "tp" / "dp" / "ep" / "pp", rank of size, and the
    optional split_dim (TP), expert_id (EP), stage_id (PP). Defaults as upstream's class."""

    def __init__(self, kind="", rank=0, size=1, split_dim=None, expert_id=None,
                 stage_id=None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def __repr__(self):
        return (f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, "
                f"split_dim={self.split_dim}, expert_id={self.expert_id}, "
                f"stage_id={self.stage_id})")


class TensorParallelism:
    """The identity of a shard: a list of ParallelAxis (`axes`)."""

    def __init__(self, axes=None):
        self.axes = list(axes or [])

    def __repr__(self):
        return f"TensorParallelism(axes={self.axes!r})"


class ReadTarget:
    """What a read returns: mode "as_stored" (the object under key), "shard" (the shard
    `parallelism` names, resharded when stored with another TP size) or "full" (the whole
    tensor). Setting another mode raises RuntimeError, as upstream's class does."""

    def __init__(self, mode="as_stored", parallelism=None):
        self.mode = mode
        self.parallelism = parallelism

    @property
    def mode(self):
        return self._mode

    @mode.setter
    def mode(self, value):
        if not isinstance(value, str) or value.lower() not in READ_MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = value.lower()

    def __repr__(self):
        return f"ReadTarget(mode={self._mode!r}, parallelism={self.parallelism!r})"


class Axis:
    """A validated axis: kind in lower case, ints or None."""
    __slots__ = ("kind", "rank", "size", "split_dim", "expert_id", "stage_id")

    def __init__(self, kind, rank, size, split_dim, expert_id, stage_id):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def with_rank(self, rank, size=None):
        return Axis(self.kind, rank, self.size if size is None else size, self.split_dim,
                    self.expert_id, self.stage_id)

    def key(self):
        return (self.kind, self.rank, self.size, self.split_dim, self.expert_id,
                self.stage_id)


def _as_int(v, name):
    """v as an int (anything with __index__, as pybind11 takes; not a bool)."""
    if isinstance(v, bool):
        raise TypeError(f"{name} must be an int")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an int") from None


def _int_or_none(obj, name):
    v = getattr(obj, name, None)
    return None if v is None else _as_int(v, name)


def _axis_of(obj):
    kind = getattr(obj, "kind", None)
    if not isinstance(kind, str) or kind.lower() not in KIND_CODES:
        raise ValueError(f"unsupported parallel axis kind {kind!r}")
    rank = _as_int(getattr(obj, "rank", None), "ParallelAxis rank")
    size = _as_int(getattr(obj, "size", None), "ParallelAxis size")
    return Axis(kind.lower(), rank, size, _int_or_none(obj, "split_dim"),
                _int_or_none(obj, "expert_id"), _int_or_none(obj, "stage_id"))


def _check_axis(a):
    if a.size <= 0 or not 0 <= a.rank < a.size:
        return f"invalid rank/size for axis {a.kind}"
    if a.kind == "tp" and a.split_dim is None:
        return "TP axis requires split_dim"
    if a.kind != "tp" and a.split_dim is not None:
        return f"{a.kind.upper()} axis must not provide split_dim"
    if a.kind == "ep" and a.expert_id is None:
        return "EP axis requires expert_id"
    if a.kind == "pp" and a.stage_id is None:
        return "PP axis requires stage_id"
    return None


def parse_parallelism(obj, what):
    """The validated axes (a list, in the caller's order) of a TensorParallelism-like object
    (anything with `axes`), or None (logged)."""
    try:
        axes = [_axis_of(a) for a in list(obj.axes)]
    except (AttributeError, TypeError, ValueError) as e:
        log.error("%s: invalid parallelism: %s", what, e)
        return None
    problem = None
    if not axes:
        problem = "parallelism axes cannot be empty"
    elif len(axes) > layout.MAX_AXES:
        problem = "axis count exceeds max supported axes"
    elif len({a.kind for a in axes}) != len(axes):
        problem = "duplicate axis kinds are not supported"
    else:
        problem = next((p for p in map(_check_axis, axes) if p), None)
    if problem:
        log.error("%s: %s", what, problem)
        return None
    return axes


def parse_writer_partition(obj, what):
    """(rank, size, split_dim) of a writer_partition-like object, or None (logged)."""
    try:
        vals = tuple(getattr(obj, n) for n in ("rank", "size", "split_dim"))
    except AttributeError:
        log.error("%s: writer_partition must provide rank, size, and split_dim", what)
        return None
    try:
        vals = tuple(_as_int(v, "writer_partition field") for v in vals)
    except TypeError:
        log.error("%s: writer_partition rank, size and split_dim must be ints", what)
        return None
    rank, size, split_dim = vals
    if size <= 0 or not 0 <= rank < size or split_dim < 0:
        log.error("%s: invalid writer partition", what)
        return None
    return vals


def parse_read_target(obj, what):
    """(mode, axes or None) of a ReadTarget-like object (None: as_stored), or None (logged)."""
    if obj is None:
        return "as_stored", None
    mode, par = getattr(obj, "mode", None), getattr(obj, "parallelism", 0)
    if not isinstance(mode, str) or mode.lower() not in READ_MODES or par == 0:
        log.error("%s: ReadTarget must provide a mode (%s) and parallelism", what,
                  "/".join(READ_MODES))
        return None
    if par is None:
        return mode.lower(), None
    axes = parse_parallelism(par, what)
    return None if axes is None else (mode.lower(), axes)


def tp_index(axes):
    return next((i for i, a in enumerate(axes) if a.kind == "tp"), None)


def canonical(axes):
    return sorted(axes, key=lambda a: _CANONICAL_ORDER[a.kind])


def _suffix(a):
    s = f"{a.kind}_{a.rank}of{a.size}"
    if a.split_dim is not None:
        s += f"_sd{a.split_dim}"
    if a.expert_id is not None:
        s += f"_eid{a.expert_id}"
    if a.stage_id is not None:
        s += f"_sid{a.stage_id}"
    return s


def shard_key(base, axes):
    """Upstream's get_parallelism_key_name."""
    if len(axes) == 1 and axes[0].kind == "tp":
        return f"{base}_tp_{axes[0].rank}"
    return base + "".join("__" + _suffix(a) for a in canonical(axes))


def writer_key(base, rank, size, split_dim):
    return f"{base}__writer_{rank}of{size}_sd{split_dim}"


def parallelism_manifest_key(base):
    return base + "__parallelism_manifest"


def writer_manifest_key(base):
    return base + "__writer_manifest"


def layout_axes(axes, local_shape):
    """The LayoutAxis tuples of `axes` (in order) for a shard of `local_shape`, or None when
    a split_dim is out of range (upstream's build_shard_metadata_from_shapes)."""
    out = []
    for i, a in enumerate(axes):
        extent = 0
        if a.split_dim is not None:
            if not 0 <= a.split_dim < len(local_shape):
                return None
            extent = local_shape[a.split_dim]
        extra = a.expert_id if a.kind == "ep" else a.stage_id if a.kind == "pp" else None
        out.append((KIND_CODES[a.kind], i, a.rank, a.size,
                    -1 if a.split_dim is None else a.split_dim, extra or 0, extent))
    return out


def shard_metadata(code, global_shape, local_shape, nbytes, axes):
    """SHARD metadata of a shard, or None (a split_dim out of range)."""
    lax = layout_axes(axes, local_shape)
    if lax is None or not axes or len(axes) > layout.MAX_AXES:
        return None
    return layout.Metadata(code, global_shape, local_shape, nbytes, layout.LAYOUT_SHARD, lax)


def axes_of_metadata(md):
    """The canonical Axis list of a stored SHARD object's metadata, or None for FULL."""
    if md.layout_kind != layout.LAYOUT_SHARD:
        return None
    out = []
    for kind, _, rank, count, split_dim, r0, _ in md.axes:
        name = _KIND_NAMES.get(kind)
        if name is None:
            return None
        out.append(Axis(name, rank, count, None if split_dim < 0 else split_dim,
                        r0 if name == "ep" else None, r0 if name == "pp" else None))
    return canonical(out)


def pack_manifest(code, global_shape, split_dim, shard_count):
    dims = tuple(global_shape) + (-1,) * (layout.MAX_DIMS - len(global_shape))
    return _MANIFEST.pack(MANIFEST_MAGIC, 1, MANIFEST_SIZE, code, len(global_shape), split_dim,
                          shard_count, 0, *dims)


def parse_manifest(raw):
    """(dtype code, global_shape, split_dim, shard_count) of manifest bytes, or None."""
    if raw is None or len(raw) < MANIFEST_SIZE:
        return None
    magic, version, size, code, ndim, split_dim, count, _, *dims = \
        _MANIFEST.unpack_from(bytes(raw[:MANIFEST_SIZE]))
    if magic != MANIFEST_MAGIC or version != 1 or size != MANIFEST_SIZE:
        return None
    if not 0 <= ndim <= layout.MAX_DIMS or count <= 0 or not 0 <= split_dim < ndim:
        return None
    shape = tuple(dims[:ndim])
    if any(d < 0 for d in shape) or code not in layout.DTYPES:
        return None
    return code, shape, split_dim, count
