"""umprov's local lab: simulated GPU hosts in containers, so the whole flow (provision, deploy,
verify) runs without GPUs, and the tests run against real hosts. A separate distribution
(umprov-lab) that adds `umprov lab` through the entry point group ``umprov.commands``; umprov
itself never imports it.

Modules: ``lab`` (up, status, down), ``hosts`` (the host containers), ``host_image`` (their
image), ``stand_in_repo`` and ``apt_repo`` (the signed stand-in of NVIDIA's repositories),
``registry`` (a TLS registry), ``inventory`` (what ``lab up`` writes), ``image`` (the PyTorch
image for lab hosts) and ``torch_wheel`` (its CPU torch), ``engine`` (Docker and kernel limits
here), ``cli``.
"""
