"""Reference models that are not in a model zoo, for `hwlat profile`'s training zoo.

Each factory returns what a `file.py:FACTORY` spec may return: a module, or a dict with `model`
and `inputs`.
"""

from torch import nn


def transformer_encoder() -> nn.Module:
    """A BERT-base-sized `nn.TransformerEncoder` (eval mode takes PyTorch's fused fast path)."""
    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).eval()
