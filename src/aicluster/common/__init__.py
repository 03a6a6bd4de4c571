"""What several components share, written once, below the components."""
