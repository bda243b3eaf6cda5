"""OpenCL device choice, one context and queue per device, and the kernel programs.

The device is named by a spec (``--device`` / ``--opencl-device``, or the
``PANJOIN_OPENCL_DEVICE`` environment variable), matched in this order:

- ``""`` or ``default``: a pocl CPU device that can build kernels (pip's pocl, or
  Debian's pocl-opencl-icd, which `make` installs where apt is at hand: pip's pocl
  cannot compile for CPUs its LLVM does not know, e.g. AMD Zen 5), else the first GPU
  or accelerator, else the first device;
- ``cpu``, ``gpu``, ``accelerator``: the first device of that type;
- ``P:D`` (two integers): device D of platform P, as ``panjoin opencl-devices`` lists;
- any other text: the first device whose platform vendor, platform name or device
  name contains it (case-insensitive), e.g. ``pocl``, ``nvidia``, ``intel(r) fpga``.

Programs are built once per (device, key type) and kept for the process; pyopencl's
on-disk binary cache and pocl's kernel cache spare later processes the compile.
Every failure is an :class:`OpenCLError` that says how to fix it (no platform,
no such device, no float64 on the device, a kernel that does not build: with
the build log).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENV_DEVICE = "PANJOIN_OPENCL_DEVICE"
KERNEL_DIR = Path(__file__).parent / "kernels"

_LOCK = threading.Lock()
_RUNTIMES: dict[str, Runtime] = {}


class OpenCLError(RuntimeError):
    """No usable OpenCL platform or device, or a kernel that does not build."""


def _cl():
    try:
        import pyopencl as cl
    except ImportError as e:  # pragma: no cover - the extra is installed by make
        raise OpenCLError(
            "the OpenCL index needs pyopencl: pip install -e '.[opencl]' "
            "(pyopencl + pocl-binary-distribution)") from e
    return cl


def list_devices() -> list[tuple[int, int, object]]:
    """``(platform_no, device_no, device)`` of every OpenCL device; OpenCLError if none."""
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        raise OpenCLError(
            "no OpenCL platform found (the ICD loader saw no driver: "
            f"{e}). Install one: pip install pocl-binary-distribution==3.0 for the CPU, "
            "or a vendor driver that registers in /etc/OpenCL/vendors; OCL_ICD_VENDORS "
            "must not point to an empty folder") from e
    out = []
    for p, plat in enumerate(platforms):
        try:
            devs = plat.get_devices()
        except cl.Error:
            continue  # a platform with no device of its own
        out += [(p, d, dev) for d, dev in enumerate(devs)]
    if not out:
        names = ", ".join(p.name.strip() for p in platforms)
        raise OpenCLError(f"OpenCL platform(s) {names} found, but no device (is POCL_DEVICES "
                          "set to a driver that is not there?); install "
                          "pocl-binary-distribution==3.0 for a CPU device")
    return out


def describe(dev) -> str:
    cl = _cl()
    kinds = [name for name, t in (("cpu", cl.device_type.CPU), ("gpu", cl.device_type.GPU),
                                  ("accelerator", cl.device_type.ACCELERATOR)) if dev.type & t]
    return f"{dev.platform.name.strip()} / {dev.name.strip()} ({', '.join(kinds) or 'other'})"


def device_table() -> str:
    """The devices as ``P:D  platform / device (type)`` lines."""
    return "\n".join(f"{p}:{d}  {describe(dev)}" for p, d, dev in list_devices())


def choose_device(spec: str | None = None):
    """The device a spec names (see the module docstring); ``None`` reads the environment."""
    cl = _cl()
    if spec is None:
        spec = os.environ.get(ENV_DEVICE, "")
    text = spec.strip()
    devs = list_devices()
    low = text.lower()

    def is_type(dev, t):
        return bool(dev.type & t)

    found = None
    if low in ("", "default"):
        found = next((d for _, _, d in devs if "portable computing language" in
                      d.platform.name.lower() and is_type(d, cl.device_type.CPU)
                      and _builds(d)), None)
        found = found or next((d for _, _, d in devs if is_type(
            d, cl.device_type.GPU | cl.device_type.ACCELERATOR)), None)
        found = found or devs[0][2]
    elif low in ("cpu", "gpu", "accelerator"):
        t = getattr(cl.device_type, low.upper())
        found = next((d for _, _, d in devs if is_type(d, t)), None)
    elif ":" in low and all(x.strip().isdigit() for x in low.split(":", 1)):
        p, d = (int(x) for x in low.split(":", 1))
        found = next((dev for pp, dd, dev in devs if (pp, dd) == (p, d)), None)
    else:
        found = next((d for _, _, d in devs
                      if low in f"{d.platform.vendor} {describe(d)}".lower()), None)
    if found is None:
        raise OpenCLError(
            f"no OpenCL device matches {spec!r} (from --device or ${ENV_DEVICE}); "
            f"the devices here are:\n{device_table()}\n"
            "name one by 'P:D', by type (cpu, gpu, accelerator) or by part of its name")
    return found


_PROBE = "__kernel void probe(__global long *a) { a[get_global_id(0)] += 1; }"
_BUILDS: dict = {}


def _builds(dev) -> bool:
    """Whether ``dev`` compiles a trivial kernel (once per device and process): pocl's
    LLVM names an unknown host CPU 'generic', which its clang then refuses."""
    cl = _cl()
    key = (dev.platform.name, dev.name, dev.int_ptr)
    if key not in _BUILDS:
        try:
            cl.Program(cl.Context([dev]), _PROBE).build()
            _BUILDS[key] = True
        except cl.Error:
            _BUILDS[key] = False
    return _BUILDS[key]


@dataclass
class Runtime:
    """One device's context, in-order queue and built programs."""

    device: object
    context: object
    queue: object
    programs: dict

    @property
    def name(self) -> str:
        return describe(self.device)

    def program(self, key_dtype) -> object:
        """The BI-Sort program for ``key_dtype`` (int64 or float64), built once."""
        kd = np.dtype(key_dtype)
        with _LOCK:
            prg = self.programs.get(kd.str)
            if prg is None:
                if kd == np.float64 and not self.device.double_fp_config:
                    raise OpenCLError(
                        f"device {self.name} has no float64 (cl_khr_fp64): float keys "
                        "cannot be stored there; use int64 keys or another device "
                        f"(--device / ${ENV_DEVICE})")
                opts = ["-DKEY_T=double", "-DKEY_IS_DOUBLE"] if kd == np.float64 else [
                    "-DKEY_T=long"]
                src = (KERNEL_DIR / "bisort.cl").read_text()
                prg = self.programs[kd.str] = build_program(self.context, src, opts)
        return prg


def build_program(context, source: str, options: list[str]):
    """Build ``source``; OpenCLError with every device's build log when it fails."""
    cl = _cl()
    prg = cl.Program(context, source)
    try:
        return prg.build(options=options)
    except cl.Error as e:
        logs = []
        for dev in context.devices:
            try:
                log = prg.get_build_info(dev, cl.program_build_info.LOG)
            except cl.Error:
                log = ""
            logs.append(f"--- build log on {describe(dev)}:\n{log.strip() or '(empty)'}")
        raise OpenCLError(
            f"OpenCL kernels failed to build with options {' '.join(options)}: {e}\n"
            + "\n".join(logs)) from e


def runtime(spec: str | None = None) -> Runtime:
    """The shared runtime of the device a spec names (one context per device)."""
    cl = _cl()
    dev = choose_device(spec)
    key = f"{dev.platform.name}|{dev.name}|{dev.int_ptr}"
    with _LOCK:
        rt = _RUNTIMES.get(key)
        if rt is None:
            ctx = cl.Context([dev])
            rt = _RUNTIMES[key] = Runtime(dev, ctx, cl.CommandQueue(ctx), {})
    return rt
