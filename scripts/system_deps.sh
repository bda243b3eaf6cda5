#!/bin/sh
# System packages the project uses when the machine offers them (run by `make` once per
# venv). Without apt or root, nothing is installed and a note says what is missing.
# - Debian's pocl-opencl-icd gives a CPU OpenCL device that compiles for any x86 CPU:
#   the pocl inside pip's pyopencl cannot compile for CPUs its LLVM does not know (e.g.
#   AMD Zen 5), and opencl/device.py then picks this one.
# - Debian's chromium is the headless browser tests/test_status_page.py drives with
#   Playwright (no browser download of Playwright's own); without it that test skips.
apt_install() {  # PACKAGE: quietly, with one `apt-get update` retry
    apt-get install -y -qq "$1" >/dev/null 2>&1 ||
        (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "$1" >/dev/null 2>&1)
}
as_root=no
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then as_root=yes; fi

if [ ! -e /etc/OpenCL/vendors/pocl.icd ]; then
    if [ $as_root = yes ]; then
        echo "installing Debian's pocl-opencl-icd (a CPU OpenCL device)"
        apt_install pocl-opencl-icd ||
            echo "note: pocl-opencl-icd could not be installed; OpenCL uses pip's pocl"
    else
        echo "note: no apt-get as root here; OpenCL uses pip's pocl (sudo apt-get install pocl-opencl-icd adds Debian's)"
    fi
fi

if ! command -v chromium >/dev/null 2>&1; then
    if [ $as_root = yes ]; then
        echo "installing Debian's chromium (the status page's browser test)"
        apt_install chromium ||
            echo "note: chromium could not be installed; tests/test_status_page.py skips its browser test"
    else
        echo "note: no apt-get as root here; tests/test_status_page.py skips its browser test (sudo apt-get install chromium)"
    fi
fi
exit 0
