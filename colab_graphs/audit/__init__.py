"""Contribution audits: the coalition game, its estimators (leave-one-out, exact and sampled Shapley), reports
and plots."""
