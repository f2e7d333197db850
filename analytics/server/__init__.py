"""The server layer: the collector's and a lake server's HTTP service (``service``), its
routes over the typed API (``http``), tokens and their scopes (``tokens``), the sign-in
throttle (``throttle``) and the route naming the pages share (``routing``).  It sits above
the analytics library and below the front ends: the library never imports it
(tests/test_layout.py)."""
