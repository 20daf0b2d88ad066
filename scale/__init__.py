"""scale/: the scale-out layer (device meshes, TensorStore weights, remote verifiers).

It imports minirl; minirl never imports it.
"""
