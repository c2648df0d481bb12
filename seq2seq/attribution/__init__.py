"""Attribution: which source words a translation's words depend on, in the layout of attention.

``base`` (the methods and the ``Attribution`` record), ``gradients`` (gradient x input, integrated
gradients, gradient-weighted attention), ``perturbation`` (occlusion, LIME, KernelSHAP) and
``attribute`` (``attribute`` / ``attribute_translation``: one entry point for every method)."""
