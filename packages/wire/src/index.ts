export const PACKAGE_NAME = "@tapwire/wire";
