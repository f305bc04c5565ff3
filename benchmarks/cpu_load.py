"""A 2-thread CPU job to run beside the suite (benchmarks/suite_time.sh): matrix products until killed."""

import torch

torch.set_num_threads(2)
a = torch.randn(1200, 1200)
while True:
    a = torch.tanh(a @ a / 1200)
