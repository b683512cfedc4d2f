//! Test peers for gpuwarden's end-to-end tests.
