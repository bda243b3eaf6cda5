"""BI-Sort on OpenCL devices: the PanJoin paper's FPGA design (section IV) as kernels.

- :mod:`opencl.bisort`: :class:`OpenCLBISort`, the ``bisort-opencl`` subwindow index;
- :mod:`opencl.device`: device choice (``PANJOIN_OPENCL_DEVICE``), contexts, programs;
- ``kernels/bisort.cl``: mergers, indexer, partitioners, probers.

Importing this package does not import pyopencl; making an index does.
"""
