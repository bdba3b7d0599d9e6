"""Host code of the launch list (launch_list.c), compiled into a shared library at its first use."""
