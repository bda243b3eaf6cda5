"""``python -m opencl``: the OpenCL devices here, and the one the default spec picks."""

import sys

from opencl.device import OpenCLError, choose_device, describe, device_table


def main() -> int:
    try:
        print(device_table())
        print(f"default (--device / $PANJOIN_OPENCL_DEVICE): {describe(choose_device())}")
    except OpenCLError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
