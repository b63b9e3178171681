"""mstarc: the walk-graph compiler. Torch-free: compiling and linting never import torch."""
