"""The ground floor: inputs and their validation, partial-label masks and segment limits, segments
and result types, the gold score and the cumulative-sum operator. Imports nothing of the package
above it."""
