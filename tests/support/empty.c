/* keeps the support archive non-empty */
typedef int oscar_testsupport_empty;
