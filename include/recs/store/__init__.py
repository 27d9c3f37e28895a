"""The live graph store (ARCHITECTURE §2): schema, connections, relationship versions, bulk
loading and the consistent reads a snapshot takes. Design notes: ``README.md`` here."""
