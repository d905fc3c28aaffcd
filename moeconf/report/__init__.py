"""Human and machine renderings of moeconf's data (inventories, placements, findings)."""
