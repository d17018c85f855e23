"""Image captioning guided by self-retrieval (Liu et al., ECCV 2018, "Show, Tell and Discriminate").

A Top-Down captioner over EfficientNet-Lite0 grid features, trained with cross-entropy (scheduled
sampling) and then self-critically with CIDEr-D plus a retrieval reward from a frozen dual encoder
(a project retrieval checkpoint). One file per concept: ``vocab``, ``model``, ``decoding``,
``cider``, ``retrieval_reward``, ``scst``, ``xe``, ``negatives``, ``data``, ``config``,
``checkpoint``, ``inference``, ``run`` (what a run holds), ``steps``, ``loop``, ``plots``.
"""
