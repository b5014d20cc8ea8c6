"""``poslab explore``: a local web page to watch attention heads read a prompt (:mod:`poslab.explore.server`).

The page, its script and style are the package data ``poslab/explore/assets/``.
"""
