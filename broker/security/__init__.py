"""Security: TLS, SASL (PLAIN, SCRAM), the principal a connection acts as, and the ACL authorizer."""
