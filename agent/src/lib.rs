//! gpuwarden node agent.
