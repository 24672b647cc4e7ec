"""Moving payload chunks between Python buffers and a Store for mooncake.structured_object_store.

The transport works with any object that has `put(key, value)`, `get(key)` and `remove(key)`
(upstream's BundleStore protocol) and uses the faster calls a store has, found by name:

  put     batch_put_from (+ register_buffer, or a BufferPool's registered leases), else put
  get     batch_get_into into one registered buffer, else get
  ranges  get_into_ranges into the registered destination, else whole chunks with get
  remove  batch_remove, then remove for what it did not remove

A call that fails is an exception naming the key and the store's code; a buffer registered here
is unregistered on every path. Destinations that the caller registered are left registered.
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence, Tuple

import numpy as np

MISSING_OBJECT_ERROR = -704     # remove of a key that is already gone
LEASE_EXPIRED = -707            # a read that ended after its lease: the bytes are not trusted
# A put of contiguous chunks adding up to this much registers them where they are (one
# batch_put_from, no copy); smaller ones are copied into BufferPool leases (registered once).
DIRECT_PUT_BYTES = 4 << 20
# Payloads over this size have their chunks' stored sizes checked before a reader allocates.
VERIFY_BYTES = 64 << 20
_DUPLICATE_REGISTRATION = -600  # register_buffer of memory already registered


def _has(store, name) -> bool:
    return callable(getattr(store, name, None))


def view_bytes(value: Any, name: str) -> memoryview:
    """A flat byte view of a bytes-like object or a C-contiguous ndarray."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"{name}: object arrays are not bytes")
        value = np.ascontiguousarray(value)
        return memoryview(value.reshape(-1).view(np.uint8))
    try:
        view = memoryview(value)
    except TypeError as error:
        raise TypeError(f"{name}: expected a bytes-like object, got {type(value).__name__}") \
            from error
    if not view.contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def address_of(view: memoryview) -> Tuple[int, Any]:
    """The address of a byte view's first byte, and an object that keeps it alive."""
    arr = np.frombuffer(view, dtype=np.uint8) if len(view) else np.empty(1, np.uint8)
    return int(arr.ctypes.data), arr


def call_with_config(fn, *args, config=None, keys=1):
    """fn(*args, config) when a config is given (its group id spread over the call's `keys`
    keys, see grouped_config); fn(*args) otherwise, for stores without the argument."""
    config = grouped_config(config, keys)
    if config is None:
        return fn(*args)
    return fn(*args, config)


_CONFIG_FIELDS = ("data_type", "group_ids", "nof_replica_num", "prefer_alloc_in_same_node",
                  "preferred_nof_segments", "preferred_segment", "preferred_segments",
                  "replica_num", "with_hard_pin", "with_soft_pin")


def copy_config(config):
    """A copy of a write config (ReplicateConfig or a look-alike) to change."""
    import copy
    try:
        return copy.copy(config)
    except TypeError:
        pass
    try:
        out = type(config)()
    except Exception as error:  # noqa: BLE001 - said below
        raise TypeError("structured object store config must be copyable or "
                        "default-constructible") from error
    for name in _CONFIG_FIELDS:
        if hasattr(config, name):
            value = getattr(config, name)
            setattr(out, name, list(value) if isinstance(value, list) else value)
    return out


def grouped_config(config, keys):
    """The config for a write of `keys` keys: one logical group id (config.group_ids, a str
    or a list of one) becomes one per key, as the store wants; an empty list means ungrouped.
    Several ids are a ValueError: a structured object is one group."""
    if config is None or keys <= 0:
        return config
    ids = getattr(config, "group_ids", None)
    if ids is None:
        return config
    as_str = isinstance(ids, str)
    ids = [ids] if as_str else list(ids)
    if not ids:
        out = copy_config(config)
        out.group_ids = None
        return out
    if len(ids) != 1:
        raise ValueError("structured object store config.group_ids must contain exactly one "
                         "logical group id; it is expanded across internal Mooncake keys")
    if keys == 1 and not as_str:
        return config
    out = copy_config(config)
    out.group_ids = [ids[0]] * keys
    return out


def check_status(rc, operation, key):
    if isinstance(rc, int) and rc < 0:
        raise RuntimeError(f"mooncake {operation} failed for {key!r}: code {rc}")


class PayloadTransport:
    def __init__(self, store, buffer_pool=None):
        self.store = store
        self.given_pool = buffer_pool
        self._own_pool = None

    @property
    def buffer_pool(self):
        """The caller's BufferPool, else one made for a real MooncakeDistributedStore (its
        leases are registered memory that batch_put_from writes without a copy); None for
        other stores."""
        if self.given_pool is not None:
            return self.given_pool
        if self._own_pool is None and type(self.store).__module__.startswith("mooncake."):
            try:
                from .buffer_pool import BufferPool
                self._own_pool = BufferPool(self.store)
            except (ImportError, AttributeError, RuntimeError, TypeError):
                self._own_pool = False
        return self._own_pool or None

    # -- capabilities --------------------------------------------------------------------
    def can_register(self) -> bool:
        return _has(self.store, "register_buffer") and _has(self.store, "unregister_buffer")

    # -- registration ----------------------------------------------------------------------
    def register(self, ptr: int, size: int) -> bool:
        """Registers [ptr, ptr+size); True when this call did so (and must unregister).
        Local-only where the store can (remote_accessible=False: nothing is published to
        peers, which is all a put from it or a get into it needs)."""
        try:
            rc = self.store.register_buffer(ptr, size, remote_accessible=False)
        except TypeError:
            rc = self.store.register_buffer(ptr, size)
        if rc == 0:
            return True
        if rc == _DUPLICATE_REGISTRATION:
            return False  # the caller's memory, registered already: use it as it is
        raise RuntimeError(f"mooncake register_buffer failed: code {rc}")

    def unregister(self, ptr: int) -> None:
        self.store.unregister_buffer(ptr)

    # -- puts ----------------------------------------------------------------------------
    def put_chunks(self, keys: Sequence[str], groups: Sequence[Sequence[memoryview]],
                   copy_mode: str, config=None) -> None:
        """Writes chunk i (the parts of groups[i] end to end) under keys[i]."""
        if copy_mode == "zero_copy":
            if not (_has(self.store, "batch_put_from") and self.can_register()):
                raise RuntimeError("zero-copy put needs a store with batch_put_from and "
                                   "register_buffer; use copy_mode='auto'")
            self._put_registered(keys, groups, config)
        elif copy_mode == "auto" and _has(self.store, "batch_put_from") and \
                self.can_register() and all(len(g) == 1 for g in groups) and \
                sum(len(g[0]) for g in groups) >= DIRECT_PUT_BYTES:
            self._put_registered(keys, groups, config)  # large and contiguous: no copy
        elif copy_mode == "auto" and _has(self.store, "batch_put_from") and \
                self.buffer_pool is not None:
            self._put_through_pool(keys, groups, config)
        else:
            for key, parts in zip(keys, groups):
                data = parts[0] if len(parts) == 1 else b"".join(bytes(p) for p in parts)
                check_status(call_with_config(self.store.put, key, data, config=config),
                             "put", key)

    def _batch_put(self, keys, ptrs, sizes, config):
        results = call_with_config(self.store.batch_put_from, list(keys), list(ptrs),
                                   list(sizes), config=config, keys=len(keys))
        if results is None or len(results) != len(keys):
            raise RuntimeError("mooncake batch_put_from returned the wrong number of results")
        for key, rc in zip(keys, results):
            check_status(rc, "batch_put_from", key)

    def _put_through_pool(self, keys, groups, config):
        for key, parts in zip(keys, groups):
            size = sum(len(p) for p in parts)
            lease = self.buffer_pool.acquire(size)
            try:
                at = 0
                for part in parts:
                    ctypes.memmove(lease.ptr + at, address_of(part)[0], len(part))
                    at += len(part)
                self._batch_put([key], [lease.ptr], [size], config)
            finally:
                lease.release()

    def _put_registered(self, keys, groups, config):
        """One batch_put_from for all chunks, each from where it is when it is one part
        (registered for the call), else from a registered staging copy."""
        ptrs, sizes, holders, registered = [], [], [], []
        try:
            for parts in groups:
                size = sum(len(p) for p in parts)
                if len(parts) == 1:
                    ptr, holder = address_of(parts[0])
                else:
                    holder = np.empty(max(size, 1), dtype=np.uint8)
                    ptr, at = int(holder.ctypes.data), 0
                    for part in parts:
                        holder[at:at + len(part)] = np.frombuffer(part, dtype=np.uint8)
                        at += len(part)
                holders.append(holder)
                if size and self.register(ptr, size):
                    registered.append(ptr)
                ptrs.append(ptr)
                sizes.append(size)
            self._batch_put(keys, ptrs, sizes, config)
        finally:
            for ptr in registered:
                self.unregister(ptr)

    # -- gets ------------------------------------------------------------------------------
    def read_chunks_into(self, chunks: Sequence[dict], dest_ptr: int) -> None:
        """Reads the chunks end to end into memory at dest_ptr (their sizes added up)."""
        if not chunks:
            return
        total = sum(int(c["bytes"]) for c in chunks)
        if _has(self.store, "batch_get_into") and self.can_register():
            mine = self.register(dest_ptr, total)
            try:
                keys, ptrs, sizes, at = [], [], [], 0
                for chunk in chunks:
                    keys.append(chunk["key"])
                    ptrs.append(dest_ptr + at)
                    sizes.append(int(chunk["bytes"]))
                    at += int(chunk["bytes"])
                results = self.store.batch_get_into(keys, ptrs, sizes)
                for key, size, rc in zip(keys, sizes, results):
                    if rc != size:
                        raise RuntimeError(f"mooncake batch_get_into of {key!r} returned {rc}, "
                                           f"expected {size} bytes")
            finally:
                if mine:
                    self.unregister(dest_ptr)
            return
        at = 0
        for chunk in chunks:
            data = self.get_chunk(chunk)
            ctypes.memmove(dest_ptr + at, address_of(memoryview(data))[0], len(data))
            at += len(data)

    def get_chunk(self, chunk: dict) -> bytes:
        key, size = chunk["key"], int(chunk["bytes"])
        data = self.store.get(key)
        if data is None or len(data) != size:
            got = "nothing" if data is None else f"{len(data)} bytes"
            raise RuntimeError(f"mooncake get of {key!r} returned {got}, expected {size} bytes"
                               " (the object is gone or was replaced)")
        return data

    def check_stored(self, spec: dict) -> None:
        """Before memory is allocated for a payload over VERIFY_BYTES: its chunks' sizes as
        the store has them (get_size) must be the manifest's. A manifest comes from any
        client: one that claims more than was stored must not make a reader allocate (and
        fault in) that much. Stores without get_size are trusted."""
        if int(spec["bytes"]) <= VERIFY_BYTES or not _has(self.store, "get_size"):
            return
        for chunk in spec["chunks"]:
            real = self.store.get_size(chunk["key"])
            if real != int(chunk["bytes"]):
                raise ValueError(f"payload chunk {chunk['key']!r} holds {real} bytes in the "
                                 f"store, not the {chunk['bytes']} its manifest says")

    def read_payload(self, spec: dict) -> bytearray:
        self.check_stored(spec)
        out = bytearray(int(spec["bytes"]))
        if out:
            self.read_chunks_into(spec["chunks"], address_of(memoryview(out))[0])
        return out

    def read_ranges_into(self, spec: dict, dest_ptr: int,
                         ranges: Sequence[Tuple[int, int, int]],
                         dest_registered: bool = False) -> None:
        """Copies payload bytes [src, src+length) to dest_ptr + dst for each (src, dst, length),
        reading only the chunks (and, with get_into_ranges, only the bytes) they cover."""
        pieces = _fragments(spec["chunks"], _coalesced(ranges))
        if not pieces:
            return
        if _has(self.store, "get_into_ranges") and (dest_registered or self.can_register()):
            self._ranges_registered(pieces, dest_ptr, ranges, dest_registered)
            return
        cache = {}
        for key, chunk, src, dst, length in pieces:
            if key not in cache:
                cache[key] = self.get_chunk(chunk)
            ctypes.memmove(dest_ptr + dst, address_of(memoryview(cache[key]))[0] + src, length)

    def _ranges_registered(self, pieces, dest_ptr, ranges, dest_registered):
        span = max(dst + length for _src, dst, length in ranges)
        mine = False if dest_registered else self.register(dest_ptr, span)
        try:
            keys, dsts, srcs, sizes, index = [], [], [], [], {}
            for key, _chunk, src, dst, length in pieces:
                if key not in index:
                    index[key] = len(keys)
                    keys.append(key)
                    dsts.append([])
                    srcs.append([])
                    sizes.append([])
                i = index[key]
                dsts[i].append(dst)
                srcs[i].append(src)
                sizes[i].append(length)
            results = self.store.get_into_ranges([dest_ptr], [keys], [dsts], [srcs], [sizes])
            if any(LEASE_EXPIRED in got for got in results[0]):
                # A read that outlasted its lease (a slow or long one): once more, with a new
                # lease, as the Store's own gets do.
                results = self.store.get_into_ranges([dest_ptr], [keys], [dsts], [srcs],
                                                     [sizes])
            for key, want, got in zip(keys, sizes, results[0]):
                if list(got) != list(want):
                    raise RuntimeError(f"mooncake get_into_ranges of {key!r} returned {list(got)},"
                                       f" expected {list(want)}")
        finally:
            if mine:
                self.unregister(dest_ptr)

    # -- removes ---------------------------------------------------------------------------
    def remove_keys(self, keys: Sequence[str], strict: bool) -> None:
        """Removes keys (force: they are this module's own); a key already gone is fine.
        strict: raise when one could not be removed, after trying all of them."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return
        left = keys
        if _has(self.store, "batch_remove"):
            try:
                results = self.store.batch_remove(keys, True)
                left = [k for k, rc in zip(keys, results) if rc not in (0, MISSING_OBJECT_ERROR)]
            except Exception:
                left = keys
        failed = []
        for key in left:
            try:
                rc = self.store.remove(key, True)
            except TypeError:
                rc = self.store.remove(key)
            except Exception as error:  # noqa: BLE001 - reported below
                failed.append(f"{key}: {error}")
                continue
            if isinstance(rc, int) and rc not in (0, MISSING_OBJECT_ERROR):
                failed.append(f"{key}: code {rc}")
        if failed and strict:
            raise RuntimeError("mooncake remove failed for " + "; ".join(failed))


def _coalesced(ranges):
    """The ranges with each run that continues the previous one in both the payload and the
    destination joined into one (rows read in order become one read)."""
    out = []
    for src, dst, length in ranges:
        if out and out[-1][0] + out[-1][2] == src and out[-1][1] + out[-1][2] == dst:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + length)
        else:
            out.append((src, dst, length))
    return out


def _fragments(chunks, ranges):
    """(key, chunk, offset in chunk, destination offset, length) for each part of each range."""
    starts, at = [], 0
    for chunk in chunks:
        starts.append(at)
        at += int(chunk["bytes"])
    total = at
    out = []
    for src, dst, length in ranges:
        if src < 0 or length < 0 or src + length > total:
            raise ValueError(f"payload range [{src}, {src + length}) is outside its {total} bytes")
        while length > 0:
            i = _chunk_at(starts, src)
            chunk = chunks[i]
            inside = src - starts[i]
            take = min(length, int(chunk["bytes"]) - inside)
            if take <= 0:
                raise ValueError("payload chunks are malformed (an empty chunk)")
            out.append((chunk["key"], chunk, inside, dst, take))
            src, dst, length = src + take, dst + take, length - take
    return out


def _chunk_at(starts, offset):
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo
