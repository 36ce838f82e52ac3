"""The CP-SAT layout solver: the legal space, cost tables, the model, the oracle, explanations."""
