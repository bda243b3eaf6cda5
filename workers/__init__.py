"""The PanJoin worker process: a gRPC server over :mod:`panjoin.subwindow`."""
