"""NVTX ranges in gemmlab's one domain.

Every measured call runs inside ``annotate(name)``, a push/pop range in the domain
``gemmlab`` named after what it is (a backend, later a collective or a TP phase), so

    ncu --nvtx --nvtx-include "gemmlab@cuda_regblock/" ...
    nsys stats -r nvtx_sum report.nsys-rep

select exactly those calls (the trailing slash selects push/pop ranges). Without a
profiler attached a range costs about a microsecond.
"""

from __future__ import annotations

import nvtx

DOMAIN = "gemmlab"


def annotate(name: str) -> nvtx.annotate:
    """A context manager (and decorator) that pushes range ``name`` in domain ``gemmlab``."""
    return nvtx.annotate(message=name, domain=DOMAIN)
