from tokenmix.core.operator import MixOperator, solve_dense

__all__ = ["MixOperator", "solve_dense"]
