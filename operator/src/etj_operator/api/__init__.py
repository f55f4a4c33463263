"""ElasticTrainingJob API.

Pydantic models (``models``), status helpers (``status``), CRD generator (``crd``) and field
reference (``docs``).
"""

from etj_operator.api.models import *  # noqa: F403  (the models module defines __all__)
from etj_operator.api.models import __all__ as __all__
