"""Resource report and instruction census of a compiled kernel, from its PTX, cubin and SASS.

Registers, static shared memory and the local-memory frame come from the cubin's ELF sections
(`.nv.info` attributes and `.nv.shared.<kernel>`), read here in pure Python so that the report
works on a machine with no CUDA toolkit. SASS needs `nvdisasm` (PATH, `$CUDA_HOME/bin`, or the
`nvidia-cuda-nvdisasm` wheel); without it the report says so and counts PTX only.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

# .nv.info attribute codes (EIATTR_*), as nvdisasm names them.
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_MAX_STACK_SIZE = 0x23
_EIATTR_MAXREG_COUNT = 0x1B
_EIATTR_REGCOUNT = 0x2F
_EIATTR_REQNTID = 0x10

# What the census counts: (label, regex over PTX) and (label, regex over SASS).
PTX_PATTERNS = {
    "wgmma.mma_async": r"\bwgmma\.mma_async\b",
    "cp.async.bulk.tensor": r"\bcp\.async\.bulk\.tensor\b",
    "setmaxnreg": r"\bsetmaxnreg\b",
    "mbarrier": r"\bmbarrier\.",
    "ld.global.v4 (128-bit)": r"\bld\.global(?:\.[a-z0-9:]+)*\.v4\.(?:b32|f32|u32|s32)\b|\bld\.global(?:\.[a-z0-9:]+)*\.v2\.(?:b64|u64|f64)\b",
    "st.global.v4 (128-bit)": r"\bst\.global(?:\.[a-z0-9:]+)*\.v4\.(?:b32|f32|u32|s32)\b|\bst\.global(?:\.[a-z0-9:]+)*\.v2\.(?:b64|u64|f64)\b",
    "ld.global (all)": r"\bld\.global\b",
    "st.global (all)": r"\bst\.global\b",
    "shfl.sync": r"\bshfl\.sync\b",
    "bar.sync": r"\bbar(?:rier)?\.sync\b",
    "ld/st.local": r"\b(?:ld|st)\.local\b",
}
SASS_PATTERNS = {
    "HGMMA/QGMMA": r"\b[HQ]GMMA\b",
    "UTMALDG (TMA load)": r"\bUTMALDG\b",
    "UTMASTG (TMA store)": r"\bUTMASTG\b",
    "LDG.128": r"\bLDG\.E\.128\b|\bLDG\.E\.[A-Z.]*128\b",
    "STG.128": r"\bSTG\.E\.128\b|\bSTG\.E\.[A-Z.]*128\b",
    "SHFL": r"\bSHFL\.",
    "LDL/STL (spills)": r"\b(?:LDL|STL)\b",
}


@dataclass
class KernelResources:
    name: str
    registers: int | None = None
    max_registers: int | None = None
    static_smem_bytes: int = 0
    local_bytes: int = 0  # frame size: per-thread local memory (spills or local arrays)
    max_stack_bytes: int = 0
    threads: tuple[int, int, int] | None = None


@dataclass
class Report:
    kernel: str
    arch: str
    kernels: list[KernelResources]
    ptx_census: dict[str, int]
    sass_census: dict[str, int] | None
    dynamic_smem_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    from_cache: bool = False  # `compile_with_artifacts(cache=True)` found the artifacts in the compile cache

    @property
    def spills(self) -> bool:
        local = any(k.local_bytes for k in self.kernels)
        sass = bool(self.sass_census and self.sass_census.get("LDL/STL (spills)"))
        return local or sass or bool(self.ptx_census.get("ld/st.local"))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spills"] = self.spills
        return d

    def format(self) -> str:
        lines = [f"{self.kernel}  ({self.arch})"]
        for k in self.kernels:
            thr = "x".join(map(str, k.threads)) if k.threads else "?"
            lines.append(
                f"  {k.name[:90]}\n"
                f"    registers {k.registers}  threads {thr}  static smem {k.static_smem_bytes} B"
                f"  local (frame) {k.local_bytes} B  stack {k.max_stack_bytes} B"
            )
        if self.dynamic_smem_bytes is not None:
            lines.append(f"  dynamic smem (declared by the kernel): {self.dynamic_smem_bytes} B")
        lines.append(f"  spills / local memory: {'YES' if self.spills else 'none'}")
        lines.append("  PTX census:")
        lines += [f"    {name:<26} {n}" for name, n in self.ptx_census.items()]
        if self.sass_census is None:
            lines.append("  SASS census: unavailable (no nvdisasm >= 13.4 found)")
        else:
            lines.append("  SASS census:")
            lines += [f"    {name:<26} {n}" for name, n in self.sass_census.items()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def census(text: str, patterns: dict[str, str]) -> dict[str, int]:
    return {name: len(re.findall(rx, text)) for name, rx in patterns.items()}


def _sections(elf: bytes):
    """Yield (name, header dict, data) for each section of a 64-bit little-endian ELF."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not a 64-bit ELF (cubin)")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = []
    for i in range(shnum):
        (name, typ, flags, addr, off, size, link, info, align, entsize) = struct.unpack_from(
            "<IIQQQQIIQQ", elf, shoff + i * shentsize
        )
        headers.append(dict(name=name, type=typ, offset=off, size=size, link=link, info=info, entsize=entsize))
    strtab = headers[shstrndx]
    for h in headers:
        start = strtab["offset"] + h["name"]
        nm = elf[start : elf.index(b"\0", start)].decode()
        data = b"" if h["type"] == 8 else elf[h["offset"] : h["offset"] + h["size"]]  # 8 = NOBITS
        yield nm, h, data


def _symbols(elf: bytes) -> list[str]:
    secs = list(_sections(elf))
    for nm, h, data in secs:
        if nm == ".symtab":
            strdata = secs[h["link"]][2]
            names = []
            for off in range(0, len(data), 24):
                st_name, = struct.unpack_from("<I", data, off)
                names.append(strdata[st_name : strdata.index(b"\0", st_name)].decode())
            return names
    return []


def _nv_info(data: bytes):
    """Yield (attribute, value bytes) records of a .nv.info section."""
    off = 0
    while off + 4 <= len(data):
        fmt, attr = data[off], data[off + 1]
        if fmt == 0x04:  # EIFMT_SVAL: u16 size, then the value
            size, = struct.unpack_from("<H", data, off + 2)
            yield attr, data[off + 4 : off + 4 + size]
            off += 4 + size
        else:  # NVAL / BVAL / HVAL: the value fits in the 2 bytes after the header
            yield attr, data[off + 2 : off + 4]
            off += 4


def parse_cubin(cubin: bytes) -> list[KernelResources]:
    """Per-kernel registers, static smem, local frame and stack from a cubin."""
    syms = _symbols(cubin)
    kernels: dict[str, KernelResources] = {}
    per_sym: dict[int, dict[int, int]] = {}
    for nm, h, data in _sections(cubin):
        if nm.startswith(".text."):
            k = kernels.setdefault(nm[6:], KernelResources(nm[6:]))
            k.registers = h["info"] >> 24  # register count lives in the top byte of sh_info
        elif nm.startswith(".nv.shared.") and not nm.startswith(".nv.shared.reserved"):
            kernels.setdefault(nm[11:], KernelResources(nm[11:])).static_smem_bytes = h["size"]
        elif nm == ".nv.info":
            for attr, val in _nv_info(data):
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE, _EIATTR_MAX_STACK_SIZE, _EIATTR_MIN_STACK_SIZE):
                    sym, v = struct.unpack_from("<II", val)
                    per_sym.setdefault(sym, {})[attr] = v
        elif nm.startswith(".nv.info."):
            k = kernels.setdefault(nm[9:], KernelResources(nm[9:]))
            for attr, val in _nv_info(data):
                if attr == _EIATTR_MAXREG_COUNT:
                    k.max_registers, = struct.unpack_from("<H", val)
                elif attr == _EIATTR_REQNTID and len(val) >= 12:
                    k.threads = struct.unpack_from("<III", val)
    for sym, attrs in per_sym.items():
        name = syms[sym] if sym < len(syms) else f"sym{sym}"
        k = kernels.setdefault(name, KernelResources(name))
        k.registers = attrs.get(_EIATTR_REGCOUNT, k.registers)
        k.local_bytes = attrs.get(_EIATTR_FRAME_SIZE, 0)
        k.max_stack_bytes = max(attrs.get(_EIATTR_MAX_STACK_SIZE, 0), attrs.get(_EIATTR_MIN_STACK_SIZE, 0))
    return [k for k in kernels.values() if k.registers is not None]


def find_nvdisasm() -> str | None:
    """nvdisasm new enough for the DSL's cubins (>= 13.4), or None."""
    candidates = [shutil.which("nvdisasm")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvdisasm"))
    try:
        import nvidia

        for base in nvidia.__path__:
            candidates += [str(p) for p in Path(base).glob("cu*/bin/nvdisasm")]
            candidates += [str(p) for p in Path(base).glob("cuda_nvdisasm/bin/nvdisasm")]
    except ImportError:
        pass
    for c in candidates:
        if not c or not os.path.exists(c):
            continue
        try:
            out = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(r"release (\d+)\.(\d+)", out)
        if m and (int(m[1]), int(m[2])) >= (13, 4):
            return c
    return None


def disassemble(cubin_path: str | os.PathLike) -> str | None:
    tool = find_nvdisasm()
    if tool is None:
        return None
    r = subprocess.run([tool, "-c", "-g", str(cubin_path)], capture_output=True, text=True, timeout=120)
    return r.stdout if r.returncode == 0 else None


def build_report(kernel: str, arch: str, ptx: str, cubin: bytes, sass: str | None,
                 dynamic_smem_bytes: int | None = None) -> Report:
    return Report(
        kernel=kernel,
        arch=arch,
        kernels=parse_cubin(cubin),
        ptx_census=census(ptx, PTX_PATTERNS),
        sass_census=None if sass is None else census(sass, SASS_PATTERNS),
        dynamic_smem_bytes=dynamic_smem_bytes,
    )
