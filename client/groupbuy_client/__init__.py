"""groupbuy-client: typed async and blocking clients of the groupbuy HTTP API.

```python
from groupbuy_client import GroupBuyClient

async with GroupBuyClient("http://127.0.0.1:8000", key, sign=True) as gb:
    await gb.lock("spring-sale", "team-1", "bob")
```

The names below load on first use: the server imports `groupbuy_client.wire` (its answers'
shapes) without the HTTP libraries the clients need.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module defining it
_EXPORTS = {
    "GroupBuyAPIError": "groupbuy_client.client",
    "GroupBuyClient": "groupbuy_client.client",
    "GroupBuyTransportError": "groupbuy_client.client",
    "GroupBuySyncClient": "groupbuy_client.client_sync",
    "DEFAULT_RETRIES": "groupbuy_client.retries",
    "Retries": "groupbuy_client.retries",
}

__all__ = [
    "DEFAULT_RETRIES",
    "GroupBuyAPIError",
    "GroupBuyClient",
    "GroupBuySyncClient",
    "GroupBuyTransportError",
    "Retries",
]

if TYPE_CHECKING:
    from groupbuy_client.client import GroupBuyAPIError, GroupBuyClient, GroupBuyTransportError
    from groupbuy_client.client_sync import GroupBuySyncClient
    from groupbuy_client.retries import DEFAULT_RETRIES, Retries


def __getattr__(name: str) -> Any:
    """One of the exported names, imported from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'groupbuy_client' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
