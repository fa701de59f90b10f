"""What is computed: each kernel composes collectives under a schedule."""
