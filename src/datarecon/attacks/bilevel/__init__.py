"""Bilevel reconstruction (Runkel et al. 2024, eq. 2 / update 7): L-BFGS inner solve,
pluggable inverse-Hessian strategies, implicit-function hypergradient."""
