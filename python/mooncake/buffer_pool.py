"""BufferPool: leases of registered host memory for zero-copy Store I/O (upstream's API).

    pool = BufferPool(store)                  # after store.setup(...)
    with pool.acquire(n) as lease:            # lease.ptr, lease.size, lease.buffer (memoryview)
        store.get_into(key, lease.ptr, lease.size)

Each lease is memory registered with the store (register_buffer), so put_from / get_into /
batch_* / *_tensor_into move it without a staging copy. Upstream carves leases out of the
client's local buffer in C++; this package's Store keeps its local buffer private to the C++
client, so the pool owns its regions: aligned allocations (posix_memalign) registered once and
kept for reuse after release (registration is the expensive part; a released region of the
same size class is handed out again without a new registration). Size classes are powers of
two from min_size_class to max_size_class; a larger request gets a region of its exact size.

Bounds, as upstream: at most `max_bytes` in regions (default: twice the store's local buffer
size; never less than it), at most `max_regions` leases at once when given. When a request
does not fit, idle cached regions are freed first; then acquire blocks (releasing the GIL)
until a lease is released, up to `timeout` seconds (RuntimeError "timed out waiting for
buffer"), or, with block=False / block_on_exhaustion=False, raises RuntimeError "buffer pool
is exhausted". Errors are RuntimeError with upstream's messages.

Thread safety: every method may be called from any thread.
"""
import ctypes
import threading
import time
import weakref

_libc = ctypes.CDLL(None, use_errno=True)
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                 ctypes.c_size_t]
_libc.posix_memalign.restype = ctypes.c_int
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None

_SIZE_MAX = (1 << 64) - 1


class _Region:
    __slots__ = ("ptr", "size", "registered")

    def __init__(self, ptr, size):
        self.ptr, self.size, self.registered = ptr, size, False


class BufferLease:
    """One leased region: `ptr` (int), `size` (the size asked for), `buffer` (a writable
    memoryview of `size` bytes). release() gives it back; it raises while a memoryview from
    `buffer` is alive. A lease not released is given back when it is garbage-collected."""

    def __init__(self, pool, region, size):
        self._pool, self._region, self._size = pool, region, size
        self._views = []  # weak references to the arrays behind exported memoryviews

    @property
    def ptr(self):
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region.ptr

    @property
    def size(self):
        return self._size

    @property
    def buffer(self):
        import numpy as np
        ptr = self.ptr
        raw = (ctypes.c_uint8 * self._size).from_address(ptr) if self._size else \
            (ctypes.c_uint8 * 0)()
        arr = np.frombuffer(raw, dtype=np.uint8)
        self._views = [w for w in self._views if w() is not None]
        self._views.append(weakref.ref(arr))
        return memoryview(arr)

    def _exported(self):
        return any(w() is not None for w in self._views)

    def release(self):
        if self._region is None:
            return
        if self._exported():
            raise RuntimeError("cannot release buffer while exported views exist")
        self._give_back()

    def _give_back(self):
        region, self._region = self._region, None
        if region is not None and self._pool is not None:
            self._pool._release(region)
        self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self._give_back()
        except Exception:
            pass


class BufferPool:
    """Registered-memory leases for `store` (a MooncakeDistributedStore that was set up)."""

    def __init__(self, store, max_bytes=0, min_size_class=64 * 1024, max_size_class=None,
                 alignment=8 * 1024 * 1024, block_on_exhaustion=True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count=0):
        local = getattr(store, "_mc_local_buffer_size", None) if store is not None else None
        if local is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        if max_bytes == 0:
            max_bytes = 2 * local
        max_bytes = max(max_bytes, local)
        if max_bytes == 0:
            raise RuntimeError("BufferPool requires a store configured with a local buffer, "
                               "or max_bytes")
        self._store = store
        self._max_bytes = max_bytes
        self._min_class = min_size_class
        self._max_class = max_bytes if max_size_class is None else max_size_class
        self._alignment = alignment
        self._block = block_on_exhaustion
        self._timeout = default_timeout
        self._max_regions = max_regions
        self._cv = threading.Condition()
        self._idle = {}        # size -> [regions], registered, not leased
        self._in_use = set()   # ptrs of leased regions
        self._total = 0        # bytes held in regions, leased or idle
        self._closed = False
        if prewarm_size is not None and prewarm_count > 0:
            self.prewarm(prewarm_size, prewarm_count)

    # ---- sizing ----

    def _class_of(self, size):
        size = max(size, 1)
        if size > self._max_class:
            return size
        c = self._min_class
        while c < size:
            c <<= 1
        return min(c, self._max_class) if c > self._max_class else c

    # ---- regions (called with the lock held, except _free) ----

    def _new_region(self, size):
        p = ctypes.c_void_p()
        rc = _libc.posix_memalign(ctypes.byref(p), self._alignment, size)
        if rc != 0 or not p.value:
            raise RuntimeError(f"buffer allocation of {size} bytes failed (errno {rc})")
        region = _Region(p.value, size)
        rc = self._store.register_buffer(region.ptr, size)
        if rc != 0:
            _libc.free(region.ptr)
            raise RuntimeError(f"overflow buffer registration failed ({rc})")
        region.registered = True
        return region

    def _free(self, region):
        if region.registered:
            self._store.unregister_buffer(region.ptr)
            region.registered = False
        _libc.free(region.ptr)

    def _evict_idle_for(self, need):
        """Frees idle regions until `need` more bytes fit; the freed ones (to unregister)."""
        out = []
        for size in sorted(self._idle, reverse=True):
            regions = self._idle[size]
            while regions and self._total + need > self._max_bytes:
                r = regions.pop()
                self._total -= r.size
                out.append(r)
            if not regions:
                del self._idle[size]
        return out

    def _try_take(self, size_class):
        """A region for size_class, or None when it does not fit now."""
        if self._max_regions is not None and len(self._in_use) >= self._max_regions:
            return None, []
        idle = self._idle.get(size_class)
        if idle:
            r = idle.pop()
            if not idle:
                del self._idle[size_class]
            return r, []
        evicted = []
        if self._total + size_class > self._max_bytes:
            evicted = self._evict_idle_for(size_class)
            if self._total + size_class > self._max_bytes:
                return None, evicted
        self._total += size_class
        return _Region(0, size_class), evicted  # ptr 0: to allocate outside the lock

    # ---- public ----

    def acquire(self, size, block=None, timeout=None):
        """A BufferLease of `size` bytes (0 allowed)."""
        if size < 0 or size > _SIZE_MAX:
            raise RuntimeError("requested buffer size overflows")
        size_class = self._class_of(size)
        if size_class > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        block = self._block if block is None else block
        timeout = self._timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                self._raise_if_closed()
                region, evicted = self._try_take(size_class)
                if evicted:
                    self._cv.release()
                    try:
                        for r in evicted:
                            self._free(r)
                    finally:
                        self._cv.acquire()
                if region is not None:
                    break
                if not block:
                    raise RuntimeError("buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError("timed out waiting for buffer")
                self._cv.wait(left)
            if region.ptr == 0:
                try:
                    region = self._new_region(size_class)
                except Exception:
                    self._total -= size_class
                    self._cv.notify_all()
                    raise
            self._in_use.add(region.ptr)
        return BufferLease(self, region, size)

    def buffer(self, size, block=None, timeout=None):
        """acquire() under upstream's other name."""
        return self.acquire(size, block, timeout)

    def prewarm(self, size, count):
        """Registers `count` idle regions for requests of `size` bytes now (as far as they
        fit), so that the first acquires need no registration."""
        size_class = self._class_of(size)
        made = []
        with self._cv:
            self._raise_if_closed()
            room = (self._max_bytes - self._total) // size_class
            n = max(0, min(count, room))
            self._total += n * size_class
        try:
            for _ in range(n):
                made.append(self._new_region(size_class))
        finally:
            with self._cv:
                self._total -= (n - len(made)) * size_class
                self._idle.setdefault(size_class, []).extend(made)
                self._cv.notify_all()

    def _release(self, region):
        with self._cv:
            if region.ptr not in self._in_use:
                raise RuntimeError("buffer lease is not active")
            self._in_use.discard(region.ptr)
            if self._closed:
                self._total -= region.size
                drop = True
            else:
                self._idle.setdefault(region.size, []).append(region)
                drop = False
            self._cv.notify_all()
        if drop:
            self._free(region)

    def close(self):
        """Frees every region; RuntimeError while leases are active."""
        with self._cv:
            if self._closed:
                return
            if self._in_use:
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            idle = [r for rs in self._idle.values() for r in rs]
            self._idle.clear()
            self._total = 0
            self._cv.notify_all()
        for r in idle:
            self._free(r)

    def _raise_if_closed(self):
        if self._closed:
            raise RuntimeError("buffer pool is closed")

    def __del__(self):
        try:
            if not self._in_use:
                self.close()
        except Exception:
            pass


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease

__all__ = ["BufferPool", "RegisteredBufferPool", "BufferLease", "RegisteredBufferLease"]
