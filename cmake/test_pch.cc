// zo_test_pch needs one source of its own (cmake/ZoHelpers.cmake).
