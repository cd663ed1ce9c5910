"""How a provider SDK's exception becomes a :class:`~cuaderno.errors.GatewayError` of the right class.

Public for callers that hold an SDK client themselves (the framework integrations in
:mod:`cuaderno.integrations`): the class decides what replay does with the send (``transient``
and not sent: sent again; ``ambiguous``: counted as possibly billed twice; ``permanent``: the run
ends), so every caller must classify an SDK failure the way cuaderno's own gateways do.
"""

from cuaderno.gateway._errors import from_exception, from_status

__all__ = ["from_exception", "from_status"]
