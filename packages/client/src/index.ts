export const PACKAGE_NAME = "@tapwire/client";
