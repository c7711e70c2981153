"""Deployments control plane: an aiohttp API over a catalog and KServe on Kubernetes."""

__all__ = ["__version__"]
__version__ = "0.1.0"
