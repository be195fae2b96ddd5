"""The cluster simulator: the product's scheduling code on a virtual clock (see cluster.py)."""
