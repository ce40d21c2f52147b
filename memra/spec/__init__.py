"""Speculative decoding: drafters (memra.spec.drafters), the draft-verify-rollback loop
(memra.spec.decode) and its gate, `memra spec-check` (memra.spec.check). The output is plain
decode's, token for token, greedy or seeded: see memra.spec.decode and docs/SPEC.md."""
