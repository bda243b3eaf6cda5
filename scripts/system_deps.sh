#!/bin/sh
# System packages the project uses when the machine offers them (run by `make` once per
# venv). Debian's pocl-opencl-icd gives a CPU OpenCL device that compiles for any x86 CPU:
# the pocl inside pip's pyopencl cannot compile for CPUs its LLVM does not know (e.g. AMD
# Zen 5), and opencl/device.py then picks this one. Without apt or root, nothing happens.
if [ -e /etc/OpenCL/vendors/pocl.icd ]; then exit 0; fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's pocl-opencl-icd (a CPU OpenCL device)"
    (apt-get install -y -qq pocl-opencl-icd >/dev/null 2>&1 ||
     (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq pocl-opencl-icd >/dev/null 2>&1)) ||
        echo "note: pocl-opencl-icd could not be installed; OpenCL uses pip's pocl"
else
    echo "note: no apt-get as root here; OpenCL uses pip's pocl (sudo apt-get install pocl-opencl-icd adds Debian's)"
fi
exit 0
