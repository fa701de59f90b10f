"""The one way this project compiles a kernel: `cute.compile` with TVM-FFI for a named arch, behind
an in-memory and on-disk cache.

Cache key: catalogue name, config fragment, signature (dtypes, alignment/vector class, index width),
arch, and a fingerprint of the DSL/TVM-FFI/Python versions plus every source file of the project's
three packages. Dimensions are symbolic in the fake tensors a kernel is compiled against, so a new
batch size or sequence length reuses the compiled code.

On disk the compiled module is exported as an object file (`export_to_c`) and reloaded with
`cute.runtime.load_module` (~2 ms instead of ~1.5 s of tracing and codegen). Writers take an
exclusive `flock` per key, compile, write to a private temp file and `os.replace` it into place;
readers take the shared lock, so concurrent processes never see a partial file and a cold key is
compiled once. Environment: `CUTE_KERNELS_CACHE_DIR` (default `~/.cache/cute_kernels`),
`CUTE_KERNELS_DISK_CACHE=0` to keep the cache in memory only, `CUTE_KERNELS_PDL=0` to trace kernels without
programmatic dependent launch (`collectives.pdl`; kept in a directory of their own).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cute_kernels.lazy import cute
from cute_kernels.target import check_arch, current_arch

_PROJECT_PACKAGES = ("cute_kernels", "collectives", "schedules")
_EXPORT_NAME = "func"


@dataclass(frozen=True)
class CacheKey:
    kernel: str  # catalogue name, e.g. "elementwise.add"
    config: str  # the config's str(), e.g. "t256u4c8v8"
    signature: str  # dtypes and static shape class, e.g. "bf16|i32"
    arch: str = field(default_factory=current_arch)

    def __str__(self) -> str:
        return f"{self.kernel}[{self.config}]({self.signature})@{self.arch}"

    def digest(self) -> str:
        return hashlib.sha256(str(self).encode()).hexdigest()[:32]


def pdl_launch() -> bool:
    """Whether kernels are traced with programmatic dependent launch (`collectives.pdl.LAUNCH`, which a process may
    set; before that module is imported, its environment default)."""
    mod = sys.modules.get("collectives.pdl")
    return mod.LAUNCH if mod is not None else os.environ.get("CUTE_KERNELS_PDL", "1") != "0"


def _project_root() -> Path:
    return Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Hash of the toolchain versions and of every .py file in the project's packages."""
    return fingerprint_of(_project_root())


def _version(dist: str, module: str) -> str:
    """A dependency's version from its installed metadata (importing the DSL to ask costs ~0.7 s), else the module's."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:  # unpacked without metadata (the lab's GPU bundle)
        return importlib.import_module(module).__version__


def fingerprint_of(root: Path) -> str:
    h = hashlib.sha256()
    h.update(f"py{sys.version_info[0]}.{sys.version_info[1]}".encode())
    h.update(f"cutlass-dsl={_version('nvidia-cutlass-dsl', 'cutlass')};"
             f"tvm-ffi={_version('apache-tvm-ffi', 'tvm_ffi')}".encode())
    for pkg in _PROJECT_PACKAGES:
        for src in sorted((root / pkg).rglob("*.py")):
            h.update(src.relative_to(root).as_posix().encode())
            data = src.read_bytes()
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()[:20]


def compile_options(arch: str | None = None, dump_dir: str | None = None) -> str:
    arch = check_arch(arch or current_arch())
    opts = f"--enable-tvm-ffi --gpu-arch {arch}"
    if dump_dir:
        opts += f" --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    return opts


def compile_fn(fn: Callable, args: tuple, arch: str | None = None, dump_dir: str | None = None):
    """Trace and compile `fn(*args)` (args: fake tensors, scalars, a fake stream) for `arch`."""
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
    return cute.compile(fn, *args, options=compile_options(arch, dump_dir))


class _FileLock:
    def __init__(self, path: Path, exclusive: bool, timeout: float = 300.0):
        self.path, self.exclusive, self.timeout = path, exclusive, timeout
        self.fd = -1

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        kind = fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, kind | fcntl.LOCK_NB)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise TimeoutError(f"timed out waiting for compile lock {self.path}")
                time.sleep(0.05)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0


class CompileCache:
    """Compiled kernels by `CacheKey`: memory first, then disk, then a compile."""

    def __init__(self, root: str | os.PathLike | None = None, disk: bool | None = None):
        if root is None:
            root = os.environ.get("CUTE_KERNELS_CACHE_DIR") or Path.home() / ".cache" / "cute_kernels"
        if disk is None:
            disk = os.environ.get("CUTE_KERNELS_DISK_CACHE", "1") != "0"
        self.root = Path(root)
        self.disk = disk
        self.stats = CacheStats()
        self._memory: dict[CacheKey, Any] = {}
        # (kernel name, schedule object or None, the call's other parameters) -> the compiled function:
        # `KernelSpec.compiled`'s lookup before it resolves anything (an op's hot path)
        self.memo: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def directory(self) -> Path:
        # kernels traced with programmatic dependent launch off (`collectives.pdl.LAUNCH`) live apart
        d = self.root / (source_fingerprint() + ("" if pdl_launch() else "-plain"))
        d.mkdir(parents=True, exist_ok=True)
        return d

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._memory

    def get(self, key: CacheKey, build: Callable[[], tuple[Callable, tuple]]) -> Any:
        """The compiled function for `key`; `build()` returns (jit fn, compile args) on a miss."""
        fn = self._memory.get(key)
        if fn is not None:
            self.stats.memory_hits += 1
            return fn
        with self._lock:
            fn = self._memory.get(key)
            if fn is None:
                fn = self._load_or_compile(key, build)
                self._memory[key] = fn
            return fn

    def _compile(self, key: CacheKey, build) -> Any:
        t0 = time.perf_counter()
        jit_fn, args = build()
        compiled = compile_fn(jit_fn, args, key.arch)
        self.stats.compiles += 1
        self.stats.compile_seconds += time.perf_counter() - t0
        return compiled

    def _load_or_compile(self, key: CacheKey, build) -> Any:
        if not self.disk:
            return self._compile(key, build)
        d = self.directory()
        obj = d / f"{key.digest()}.o"
        lock = d / f"{key.digest()}.lock"
        if obj.exists():
            with _FileLock(lock, exclusive=False):
                loaded = self._try_load(obj)
            if loaded is not None:
                return loaded
        with _FileLock(lock, exclusive=True):
            if obj.exists():  # another process compiled it while we waited
                loaded = self._try_load(obj)
                if loaded is not None:
                    return loaded
            compiled = self._compile(key, build)
            self._write(key, compiled)
            return compiled

    def _write(self, key: CacheKey, compiled) -> None:
        """Export `compiled` as the disk entry of `key` (a private temp file renamed into place; the caller holds
        the key's exclusive lock)."""
        d = self.directory()
        obj = d / f"{key.digest()}.o"
        tmp = obj.with_name(f"{obj.name}.{os.getpid()}.tmp")
        try:
            compiled.export_to_c(object_file_path=str(tmp), function_name=_EXPORT_NAME)
            os.replace(tmp, obj)
            (d / f"{key.digest()}.key").write_text(str(key) + "\n")
        except Exception as e:  # the kernel still runs; it just recompiles next process
            warnings.warn(f"cute_kernels: could not write {obj}: {e}", RuntimeWarning)
            tmp.unlink(missing_ok=True)

    def put(self, key: CacheKey, compiled) -> None:
        """Keep a kernel compiled elsewhere (`artifacts.compile_with_artifacts`) under `key`: in memory, and on
        disk unless an entry is there already."""
        with self._lock:
            self._memory.setdefault(key, compiled)
        if not self.disk:
            return
        d = self.directory()
        with _FileLock(d / f"{key.digest()}.lock", exclusive=True):
            if not (d / f"{key.digest()}.o").exists():
                self._write(key, compiled)

    def artifacts_dir(self, key: CacheKey) -> Path | None:
        """Where `key`'s PTX, cubin and SASS are kept beside its compiled object (None: no disk cache)."""
        return self.directory() / f"{key.digest()}.artifacts" if self.disk else None

    def _try_load(self, obj: Path):
        try:
            fn = cute.runtime.load_module(str(obj), enable_tvm_ffi=True)[_EXPORT_NAME]
        except Exception as e:
            warnings.warn(f"cute_kernels: ignoring unreadable cache entry {obj}: {e}", RuntimeWarning)
            return None
        self.stats.disk_hits += 1
        return fn

    def clear_memory(self) -> None:
        with self._lock:
            self._memory.clear()
            self.memo.clear()


_default_cache: CompileCache | None = None


def default_cache() -> CompileCache:
    global _default_cache
    if _default_cache is None:
        _default_cache = CompileCache()
    return _default_cache
