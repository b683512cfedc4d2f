//! gpuwarden's cluster controller: resource slots, the fractional GPU allocator and the scheduler.
