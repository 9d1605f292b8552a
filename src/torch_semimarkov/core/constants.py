"""Constants shared by every streaming implementation."""

#: Public threshold for forbidden moves: a ``transition`` or ``duration_bias`` entry that is
#: ``-inf`` or at most ``NEG_INF`` forbids that move or duration exactly (a sequence whose every
#: segmentation uses one has log Z = -inf).
NEG_INF = -1e9

#: Internal value of an impossible state or forbidden entry. Finite, so that sums and differences
#: of masked values never produce NaN, and so negative that no sum of real scores comes near it:
#: a value below :data:`IMPOSSIBLE_BELOW` is exactly "impossible". The recurrences never shift their
#: normaliser by an impossible value and clamp impossible values back to this floor, so in float32
#: and float64 alike it neither overflows nor costs the real values any precision.
IMPOSSIBLE = -1e30

#: A recurrence value (relative to its running normaliser) below this is impossible.
IMPOSSIBLE_BELOW = -1e29

#: Largest magnitude accepted for a finite score: far below |IMPOSSIBLE_BELOW| so that no sum of
#: real scores along a sequence can be mistaken for an impossible one.
MAX_ABS_SCORE = 1e15

#: The error for a ``boundary_mask`` value outside {-1, 0, 1}.
BOUNDARY_VALUES = "boundary_mask values must be -1 (no segment starts here), 0 (free) or 1 (a segment starts here)"
