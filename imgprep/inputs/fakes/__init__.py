"""Small faithful copies of ImageNet in each form a user may hold, with known labels."""
