"""datarecon: training-data reconstruction attacks and their evaluation.

Reconstruct training data from a trained network's weights (KKT attack of Haim
et al. 2022, DecoReco of Buzaglo et al. 2023, the bilevel attack of Runkel et
al. 2024) and measure whether an attacker can tell real reconstructions from
plausible fakes.
"""

__version__ = "0.1.0"
